//! Images coming in (the picture img2img and inpaint start from, the inpaint mask): decoded
//! under limits, never trusted, and turned into what the pipeline takes as diffusers'
//! `VaeImageProcessor` turns them.
//!
//! - A picture is read as RGB (an alpha channel is dropped, as PIL's `convert("RGB")` does; a
//!   grey picture is repeated over the three channels).
//! - A mask is read as PIL's `convert("L")` reads it (ITU-R 601 luma in PIL's fixed point,
//!   alpha ignored), then binarised: a value of at least half of 255 repaints, below keeps.
//! - Another size than the request's is resized with Pillow's `LANCZOS`, byte for byte as
//!   diffusers resizes it ([`crate::resample`]).

use image::{DynamicImage, GrayImage, ImageFormat, RgbImage};
use std::io::Cursor;

/// The widest or tallest picture accepted: the widest image the pipeline makes.
pub const MAX_SIDE: u32 = crate::models::MAX_IMAGE_SIDE;
/// The most bytes a decoder may allocate for one picture (512 MiB): a 16-bit RGBA image
/// [`MAX_SIDE`] pixels square, and no more.
pub const MAX_DECODE_BYTES: u64 = MAX_SIDE as u64 * MAX_SIDE as u64 * 8;
/// The most bytes an input file may have before it is decoded.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} `{}`: {reason}", crate::shown::text(name))]
    Decode {
        /// The flag or field the picture came from (`--image`, `mask`).
        what: String,
        /// The file or upload name.
        name: String,
        reason: String,
    },
    /// The file could not be read; the cause names the path.
    #[error("{what}: {cause}")]
    File {
        what: String,
        cause: crate::files::FileError,
    },
}

/// The formats read: PNG, JPEG and WebP, told by their signatures (never by the name).
const FORMATS: [ImageFormat; 3] = [ImageFormat::Png, ImageFormat::Jpeg, ImageFormat::WebP];

/// What a picture's header says, read without decoding a pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    pub color: image::ColorType,
}

impl Header {
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    /// Bytes of the picture decoded in its own colour type.
    pub fn decoded_bytes(&self) -> u64 {
        self.pixels() * u64::from(self.color.bytes_per_pixel())
    }

    /// Bytes the process holds at most for this picture as an input: the decoder's buffer and
    /// the pixels it is converted into (twice the decoded size covers a decoder that widens
    /// its bytes into samples), plus the 8-bit RGB or luma copy the pipeline takes.
    pub fn held_bytes(&self) -> u64 {
        self.decoded_bytes() * 2 + self.pixels() * 4
    }
}

/// The header of `bytes` (`what`/`name` say where they came from, for messages), checked
/// against the side and pixel limits of a picture at most `max_side` pixels square.
pub fn probe_within(bytes: &[u8], what: &str, name: &str, max_side: u32) -> Result<Header, Error> {
    let max_side = max_side.min(MAX_SIDE);
    let bad = |reason: String| Error::Decode {
        what: what.into(),
        name: name.into(),
        reason,
    };
    let format = image::guess_format(bytes)
        .ok()
        .filter(|f| FORMATS.contains(f))
        .ok_or_else(|| bad("not a PNG, JPEG or WebP image".into()))?;
    let decoder = image::ImageReader::with_format(Cursor::new(bytes), format)
        .into_decoder()
        .map_err(|e| bad(e.to_string()))?;
    let (width, height) = image::ImageDecoder::dimensions(&decoder);
    let header = Header {
        format,
        width,
        height,
        color: image::ImageDecoder::color_type(&decoder),
    };
    if width == 0 || height == 0 {
        return Err(bad("the image is empty".into()));
    }
    if width > max_side || height > max_side {
        return Err(bad(format!(
            "the image is {width}×{height}; a picture may be at most {max_side} pixels each way"
        )));
    }
    if header.decoded_bytes() > MAX_DECODE_BYTES.min(u64::from(max_side).pow(2) * 8) {
        return Err(bad(format!(
            "the image is {width}×{height} in {:?}, {} decoded, more than a picture may take",
            header.color,
            crate::memory_plan::gb(header.decoded_bytes())
        )));
    }
    Ok(header)
}

/// [`probe_within`] at the largest side accepted.
pub fn probe(bytes: &[u8], what: &str, name: &str) -> Result<Header, Error> {
    probe_within(bytes, what, name, MAX_SIDE)
}

/// Decodes `bytes` (`what`/`name` say where they came from, for messages) within the limits.
pub fn decode(bytes: &[u8], what: &str, name: &str) -> Result<DynamicImage, Error> {
    decode_within(bytes, what, name, MAX_SIDE)
}

/// [`decode`] with the limits of a picture at most `max_side` pixels square (at most
/// [`MAX_SIDE`]): a caller that wants less work per picture, such as a fuzzer, asks for less.
/// The header is checked before a pixel is decoded.
pub fn decode_within(
    bytes: &[u8],
    what: &str,
    name: &str,
    max_side: u32,
) -> Result<DynamicImage, Error> {
    let max_side = max_side.min(MAX_SIDE);
    let bad = |reason: String| Error::Decode {
        what: what.into(),
        name: name.into(),
        reason,
    };
    let header = probe_within(bytes, what, name, max_side)?;
    let img = if header.format == ImageFormat::Jpeg {
        decode_jpeg(bytes, max_side).map_err(bad)?
    } else {
        let mut reader = image::ImageReader::with_format(Cursor::new(bytes), header.format);
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(max_side);
        limits.max_image_height = Some(max_side);
        limits.max_alloc = Some(MAX_DECODE_BYTES.min(u64::from(max_side).pow(2) * 8));
        reader.limits(limits);
        reader.decode().map_err(|e| bad(e.to_string()))?
    };
    if img.width() == 0 || img.height() == 0 {
        return Err(bad("the image is empty".into()));
    }
    Ok(img)
}

/// A JPEG decoded strictly: a file cut short or a damaged scan is an error, where a lenient
/// decoder (the `image` crate's) fills the missing part with grey and says nothing.
fn decode_jpeg(bytes: &[u8], max_side: u32) -> Result<DynamicImage, String> {
    use zune_jpeg::zune_core::bytestream::ZCursor;
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let options = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(max_side as usize)
        .set_max_height(max_side as usize);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder.decode_headers().map_err(|e| e.to_string())?;
    let grey = matches!(
        decoder.input_colorspace(),
        Some(ColorSpace::Luma | ColorSpace::LumaA)
    );
    let out = if grey {
        ColorSpace::Luma
    } else {
        ColorSpace::RGB
    };
    decoder.set_options(options.jpeg_set_out_colorspace(out));
    let pixels = decoder
        .decode()
        .map_err(|e| format!("the JPEG is damaged or cut short: {e}"))?;
    let (w, h) = decoder
        .dimensions()
        .map(|(w, h)| (w as u32, h as u32))
        .ok_or("the JPEG has no frame")?;
    let img = if grey {
        GrayImage::from_raw(w, h, pixels).map(DynamicImage::ImageLuma8)
    } else {
        RgbImage::from_raw(w, h, pixels).map(DynamicImage::ImageRgb8)
    };
    img.ok_or_else(|| "the JPEG's pixels do not fill its frame".into())
}

/// The bytes of the file `path`, given by the flag `what`, bounded and regular.
pub fn read_file(path: &std::path::Path, what: &str) -> Result<Vec<u8>, Error> {
    crate::files::read_bounded(path, MAX_FILE_BYTES, "input image").map_err(|cause| Error::File {
        what: what.into(),
        cause,
    })
}

/// Reads and decodes the file `path`, given by the flag `what`.
pub fn read(path: &std::path::Path, what: &str) -> Result<DynamicImage, Error> {
    let bytes = read_file(path, what)?;
    decode(&bytes, what, &path.to_string_lossy())
}

/// The picture as 8-bit RGB, alpha dropped.
pub fn to_rgb(img: &DynamicImage) -> RgbImage {
    img.to_rgb8()
}

/// The picture as PIL's 8-bit luma `L`: `(299·R + 587·G + 114·B)/1000` in PIL's 16-bit fixed
/// point, rounded; alpha ignored.
pub fn to_luma(img: &DynamicImage) -> GrayImage {
    if let DynamicImage::ImageLuma8(g) = img {
        return g.clone();
    }
    let rgb = img.to_rgb8();
    let (w, h) = rgb.dimensions();
    let data = rgb
        .pixels()
        .map(|p| {
            let [r, g, b] = p.0.map(u32::from);
            ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
        })
        .collect();
    GrayImage::from_raw(w, h, data).expect("one value per pixel")
}

/// The size diffusers gives an input when the request names none: each side rounded down to a
/// multiple of `multiple` (`VaeImageProcessor.get_default_height_width`). `None` when a side
/// would be 0.
pub fn default_size(width: u32, height: u32, multiple: u32) -> Option<(u32, u32)> {
    let (w, h) = (width - width % multiple, height - height % multiple);
    (w > 0 && h > 0).then_some((w, h))
}

/// `img` at `width`×`height` (unchanged when it already is).
fn resized<P: image::Pixel<Subpixel = u8> + 'static>(
    img: image::ImageBuffer<P, Vec<u8>>,
    width: u32,
    height: u32,
) -> image::ImageBuffer<P, Vec<u8>> {
    if img.dimensions() == (width, height) {
        return img;
    }
    crate::resample::lanczos3(&img, width, height)
}

/// The picture as the pipeline takes it: RGB at `width`×`height`.
pub fn picture(img: &DynamicImage, width: u32, height: u32) -> RgbImage {
    resized(to_rgb(img), width, height)
}

/// The mask as the pipeline takes it: one value per pixel of `width`×`height`, 1 where the
/// picture is repainted and 0 where it is kept (diffusers' `binarize`: `v/255 ≥ 0.5`).
pub fn mask(img: &DynamicImage, width: u32, height: u32) -> Vec<u8> {
    resized(to_luma(img), width, height)
        .into_raw()
        .into_iter()
        .map(|v| u8::from(v as f32 / 255.0 >= 0.5))
        .collect()
}

/// A mask from an image whose transparent pixels mark what to repaint (OpenAI's convention for
/// `images/edits`): alpha 0 becomes white, anything else black. An image without alpha is
/// read as an ordinary mask (white repaints).
pub fn mask_from_alpha(img: &DynamicImage) -> DynamicImage {
    if !img.color().has_alpha() {
        return img.clone();
    }
    let rgba = img.to_rgba8();
    let (w, h) = rgba.dimensions();
    let data = rgba
        .pixels()
        .map(|p| if p.0[3] == 0 { 255 } else { 0 })
        .collect();
    DynamicImage::ImageLuma8(GrayImage::from_raw(w, h, data).expect("one value per pixel"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luma_is_pil_fixed_point() {
        let img = DynamicImage::ImageRgb8(
            RgbImage::from_raw(3, 1, vec![255, 0, 0, 0, 255, 0, 10, 20, 250]).unwrap(),
        );
        // PIL: Image.new("RGB", ...).convert("L") gives 76, 150, 43 for these.
        assert_eq!(to_luma(&img).into_raw(), vec![76, 150, 43]);
    }

    #[test]
    fn binarises_at_half() {
        let img = DynamicImage::ImageLuma8(GrayImage::from_raw(3, 1, vec![127, 128, 255]).unwrap());
        assert_eq!(mask(&img, 3, 1), vec![0, 1, 1]);
    }

    #[test]
    fn default_size_rounds_down() {
        assert_eq!(default_size(500, 300, 16), Some((496, 288)));
        assert_eq!(default_size(15, 300, 16), None);
    }

    #[test]
    fn a_smaller_side_limit_refuses_larger_pictures() {
        let mut png = Vec::new();
        DynamicImage::ImageRgb8(RgbImage::new(40, 24))
            .write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
            .unwrap();
        assert!(decode_within(&png, "--image", "a.png", 40).is_ok());
        let e = decode_within(&png, "--image", "a.png", 32).unwrap_err();
        assert!(e.to_string().starts_with("--image `a.png`: "), "{e}");
    }

    #[test]
    fn refuses_what_is_not_an_image() {
        let e = decode(b"GIF89a....", "--image", "x.gif").unwrap_err();
        assert!(
            e.to_string()
                .contains("--image `x.gif`: not a PNG, JPEG or WebP"),
            "{e}"
        );
    }
}
