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
    #[error("writing `{}`: {cause}", path.display())]
    Io {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
    #[error("encoding `{}`: {reason}", path.display())]
    Encode {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("writing {0}")]
    Output(crate::files::FileError),
    /// A PNG to read that is missing, unreadable or not a regular file.
    #[error("{0}")]
    Input(crate::files::FileError),
    #[error("`{}` is not a PNG this tool can read: {reason}", path.display())]
    Read {
        path: std::path::PathBuf,
        reason: String,
    },
}

// Messages embed their cause rather than chain it, so the conversion is written out: `#[from]`
// would also make the file error this one's source and print it twice.
impl From<crate::files::FileError> for Error {
    fn from(e: crate::files::FileError) -> Self {
        Error::Output(e)
    }
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
    let bytes = encode_png(rgb, width, height, text).map_err(|reason| Error::Encode {
        path: path.to_path_buf(),
        reason,
    })?;
    crate::files::write_output(path, &bytes)?;
    Ok(())
}

/// The bytes of the PNG [`write_png`] writes (for answers that carry the image itself);
/// the error is the encoder's reason.
pub fn encode_png(
    rgb: &[u8],
    width: u32,
    height: u32,
    text: &[(&str, &str)],
) -> Result<Vec<u8>, String> {
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
            added.map_err(|e| e.to_string())?;
        }
        let mut w = enc.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(rgb).map_err(|e| e.to_string())?;
    }
    Ok(bytes)
}

/// The most a single compressed text chunk (zTXt, iTXt) may inflate to. A1111 infotext and
/// ComfyUI workflows are kilobytes; anything near this is a decompression bomb.
pub const MAX_TEXT_CHUNK_BYTES: usize = 8 << 20;
/// The most all text chunks of one PNG may inflate to together.
pub const MAX_TEXT_TOTAL_BYTES: usize = 32 << 20;
/// The most text chunks one PNG may have.
pub const MAX_TEXT_CHUNKS: usize = 1024;
/// The most bytes of chunk data the decoder may hold before the image data (the png crate's
/// own default is 64 MiB).
const MAX_DECODER_BYTES: usize = 16 << 20;

/// The text chunks of a PNG (tEXt, zTXt and iTXt), in file order. Compressed chunks are
/// inflated within [`MAX_TEXT_CHUNK_BYTES`] each and [`MAX_TEXT_TOTAL_BYTES`] together, and a
/// PNG with more than [`MAX_TEXT_CHUNKS`] is refused, so a small file cannot take much memory.
pub fn read_png_text(path: &Path) -> Result<Vec<(String, String)>, Error> {
    let read_err = |reason: String| Error::Read {
        path: path.to_path_buf(),
        reason,
    };
    let (file, _) = crate::files::open_regular(path).map_err(Error::Input)?;
    let mut decoder = png::Decoder::new_with_limits(
        std::io::BufReader::new(file),
        png::Limits {
            bytes: MAX_DECODER_BYTES,
        },
    );
    decoder.set_ignore_text_chunk(false);
    let reader = decoder.read_info().map_err(|e| read_err(e.to_string()))?;
    let info = reader.info();
    let count = info.uncompressed_latin1_text.len()
        + info.compressed_latin1_text.len()
        + info.utf8_text.len();
    if count > MAX_TEXT_CHUNKS {
        return Err(read_err(format!(
            "it has {count} text chunks, more than the {MAX_TEXT_CHUNKS} a PNG may have here"
        )));
    }
    let mut budget = MAX_TEXT_TOTAL_BYTES;
    let mut out: Vec<(String, String)> = Vec::with_capacity(count);
    for t in &info.uncompressed_latin1_text {
        out.push((t.keyword.clone(), t.text.clone()));
    }
    // zTXt and iTXt chunks are two types with the same methods: one body for both, each
    // chunk inflated within what is left of the budget.
    macro_rules! inflate_within_budget {
        ($chunks:expr) => {
            for t in $chunks {
                let mut t = t.clone();
                let limit = MAX_TEXT_CHUNK_BYTES.min(budget);
                t.decompress_text_with_limit(limit)
                    .map_err(|e| read_err(inflate_error(&t.keyword, limit, e)))?;
                let text = t.get_text().map_err(|e| read_err(e.to_string()))?;
                budget -= text.len().min(budget);
                out.push((t.keyword, text));
            }
        };
    }
    inflate_within_budget!(&info.compressed_latin1_text);
    inflate_within_budget!(&info.utf8_text);
    Ok(out)
}

/// Why a compressed text chunk was not read: the limit it was read within, and the decoder's
/// complaint (damaged data, or more text than the limit).
fn inflate_error(keyword: &str, limit: usize, e: png::DecodingError) -> String {
    format!(
        "text chunk `{keyword}` does not inflate within {limit} bytes ({e}); a text chunk may hold {MAX_TEXT_CHUNK_BYTES} bytes and all of them {MAX_TEXT_TOTAL_BYTES}"
    )
}
