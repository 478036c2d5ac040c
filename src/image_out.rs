//! Writing generated images: PNG with generation metadata, written atomically.
//!
//! Two text chunks travel with the pixels: `parameters`, the A1111 infotext that image tools
//! read (see [`crate::formats::infotext`]), and `zimage`, the whole request as JSON.

use std::path::Path;

/// Keyword of the A1111-style infotext chunk.
pub const PARAMETERS_KEY: &str = "parameters";
/// Keyword of zimage's own JSON chunk.
pub const ZIMAGE_KEY: &str = "zimage";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing `{}`: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("encoding `{}`: {reason}", path.display())]
    Encode {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("writing {0}")]
    Output(#[from] crate::files::FileError),
    #[error("`{}` is not a PNG this tool can read: {reason}", path.display())]
    Read {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// Writes RGB bytes as a PNG with the given text chunks. As Pillow (and so A1111) does, a
/// text that encodes as Latin-1 goes in a tEXt chunk, which every reader understands, and any
/// other in an uncompressed iTXt chunk (UTF-8, no language tag).
pub fn write_png(
    path: &Path,
    rgb: &[u8],
    width: u32,
    height: u32,
    text: &[(&str, &str)],
) -> Result<(), Error> {
    let encode_err = |reason: String| Error::Encode {
        path: path.to_path_buf(),
        reason,
    };
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in text {
            let added = if v.chars().all(|c| (c as u32) <= 0xFF) {
                enc.add_text_chunk(k.to_string(), v.to_string())
            } else {
                enc.add_itxt_chunk(k.to_string(), v.to_string())
            };
            added.map_err(|e| encode_err(e.to_string()))?;
        }
        let mut w = enc.write_header().map_err(|e| encode_err(e.to_string()))?;
        w.write_image_data(rgb)
            .map_err(|e| encode_err(e.to_string()))?;
    }
    crate::files::write_output(path, &bytes)?;
    Ok(())
}

/// The text chunks of a PNG (tEXt, zTXt and iTXt), in file order.
pub fn read_png_text(path: &Path) -> Result<Vec<(String, String)>, Error> {
    let read_err = |reason: String| Error::Read {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_ignore_text_chunk(false);
    let reader = decoder.read_info().map_err(|e| read_err(e.to_string()))?;
    let info = reader.info();
    let mut out: Vec<(String, String)> = info
        .uncompressed_latin1_text
        .iter()
        .map(|t| (t.keyword.clone(), t.text.clone()))
        .collect();
    for t in &info.compressed_latin1_text {
        out.push((
            t.keyword.clone(),
            t.get_text().map_err(|e| read_err(e.to_string()))?,
        ));
    }
    for t in &info.utf8_text {
        out.push((
            t.keyword.clone(),
            t.get_text().map_err(|e| read_err(e.to_string()))?,
        ));
    }
    Ok(out)
}
