//! One thumbnail request: parsing and validating it (pure), resolving the source file, and the
//! CPU-heavy render (decode, resize, encode), which blocks and runs on tokio's blocking pool.

use std::io::{self, Cursor};
use std::path::{Component, Path, PathBuf};

use http::HeaderMap;
use http::header::ACCEPT;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ImageReader, Limits};

use crate::error::RequestError;

/// The longest accepted image name, in bytes (the usual file-name limit).
const MAX_NAME_BYTES: usize = 255;

/// The decoder's memory budget for one source image: 256 MiB holds an 8000x8000 RGB image, so
/// with one decode per core a worker stays under a gigabyte however large its sources are.
const SOURCE_MAX_ALLOC: u64 = 256 * 1024 * 1024;

/// The encoding of a thumbnail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Jpeg,
    Png,
}

impl Format {
    /// PNG when the `Accept` headers name `image/png` and not `image/jpeg`; otherwise JPEG.
    pub(crate) fn from_accept(headers: &HeaderMap) -> Format {
        let mut png = false;
        let mut jpeg = false;
        for value in headers.get_all(ACCEPT) {
            let value = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
            png |= value.contains("image/png");
            jpeg |= value.contains("image/jpeg");
        }
        if png && !jpeg { Format::Png } else { Format::Jpeg }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Jpeg => "image/jpeg",
            Format::Png => "image/png",
        }
    }

    pub(crate) fn extension(self) -> &'static str {
        match self {
            Format::Jpeg => "jpg",
            Format::Png => "png",
        }
    }
}

/// Decodes `%XX` escapes. A `%` not followed by two hex digits is an error, not passed through,
/// so that no two spellings of a name reach the checks differently.
fn percent_decode(raw: &str) -> Result<Vec<u8>, RequestError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = bytes.get(i + 1).and_then(|&b| (b as char).to_digit(16));
            let lo = bytes.get(i + 2).and_then(|&b| (b as char).to_digit(16));
            match (hi, lo) {
                (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                _ => return Err(RequestError::BadRequest("malformed percent-encoding".to_owned())),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Percent-decodes the `{image}` path segment and checks that it is a plain file name (see the
/// crate documentation). Returns the decoded name.
pub(crate) fn parse_image_name(raw: &str) -> Result<String, RequestError> {
    let bad = |why: &str| Err(RequestError::BadRequest(format!("invalid image name: {why}")));
    let Ok(name) = String::from_utf8(percent_decode(raw)?) else {
        return bad("not UTF-8");
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return bad("longer than 255 bytes");
    }
    if name.contains(['/', '\\']) {
        return bad("contains a path separator");
    }
    if name.contains(':') {
        return bad("contains ':'");
    }
    if name.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    let path = Path::new(&name);
    let mut components = path.components();
    if path.is_absolute() || !matches!((components.next(), components.next()), (Some(Component::Normal(_)), None)) {
        return bad("not a plain file name");
    }
    Ok(name)
}

/// Parses `w` and `h` from the query string: both required, each in `1..=max_dimension`. Other
/// parameters are ignored; a repeated `w` or `h` is an error.
pub(crate) fn parse_size(query: Option<&str>, max_dimension: u32) -> Result<(u32, u32), RequestError> {
    let mut w = None;
    let mut h = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match percent_decode(key)?.as_slice() {
            b"w" => &mut w,
            b"h" => &mut h,
            _ => continue,
        };
        if slot.is_some() {
            return Err(RequestError::BadRequest(format!("query parameter {key} given twice")));
        }
        *slot = Some(percent_decode(value)?);
    }
    let dimension = |name: &str, value: Option<Vec<u8>>| -> Result<u32, RequestError> {
        let Some(value) = value else {
            return Err(RequestError::BadRequest(format!("missing query parameter {name}")));
        };
        let text = String::from_utf8_lossy(&value);
        let Ok(n) = text.parse::<u32>() else {
            let shown: String = text.chars().take(32).collect();
            return Err(RequestError::BadRequest(format!(
                "{name} must be an integer from 1 to {max_dimension}, got {shown:?}"
            )));
        };
        if n == 0 || n > max_dimension {
            return Err(RequestError::BadRequest(format!("{name} must be from 1 to {max_dimension}, got {n}")));
        }
        Ok(n)
    };
    Ok((dimension("w", w)?, dimension("h", h)?))
}

/// Resolves a validated image name to its file: canonicalized, inside `images` (itself
/// canonical), and a regular file.
pub(crate) async fn resolve_source(images: &Path, name: &str) -> Result<PathBuf, RequestError> {
    let unknown = || RequestError::NotFound(format!("unknown image {name:?}"));
    let path = match tokio::fs::canonicalize(images.join(name)).await {
        Ok(path) => path,
        Err(err) if matches!(err.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
            return Err(unknown());
        }
        Err(err) => return Err(RequestError::Internal(format!("cannot resolve image {name:?}: {err}"))),
    };
    if !path.starts_with(images) {
        return Err(RequestError::BadRequest(format!(
            "invalid image name: {name:?} resolves outside the image directory"
        )));
    }
    match tokio::fs::metadata(&path).await {
        Ok(meta) if meta.is_file() => Ok(path),
        Ok(_) => Err(unknown()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(unknown()),
        Err(err) => Err(RequestError::Internal(format!("cannot read image {name:?}: {err}"))),
    }
}

/// Why a render failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RenderError {
    #[error("cannot read source: {0}")]
    Read(io::Error),
    #[error("cannot decode source: {0}")]
    Decode(image::ImageError),
    #[error("cannot encode thumbnail: {0}")]
    Encode(image::ImageError),
}

impl RenderError {
    pub(crate) fn into_request_error(self, image: &str) -> RequestError {
        match self {
            RenderError::Read(err) if err.kind() == io::ErrorKind::NotFound => {
                RequestError::NotFound(format!("unknown image {image:?}"))
            }
            RenderError::Decode(source) => RequestError::Undecodable { image: image.to_owned(), source },
            other => RequestError::Internal(format!("image {image:?}: {other}")),
        }
    }
}

/// Reads, decodes, resizes to fit within `w`x`h` (never enlarging) and encodes. Blocks.
pub(crate) fn render(source: &Path, w: u32, h: u32, format: Format, jpeg_quality: u8) -> Result<Vec<u8>, RenderError> {
    let bytes = std::fs::read(source).map_err(RenderError::Read)?;
    let mut reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(RenderError::Read)?;
    let mut limits = Limits::default();
    limits.max_alloc = Some(SOURCE_MAX_ALLOC);
    reader.limits(limits);
    let img = reader.decode().map_err(RenderError::Decode)?;
    let img = if img.width() <= w && img.height() <= h { img } else { img.resize(w, h, FilterType::Triangle) };
    let mut out = Vec::new();
    match format {
        Format::Jpeg => DynamicImage::ImageRgb8(img.to_rgb8())
            .write_with_encoder(JpegEncoder::new_with_quality(&mut out, jpeg_quality)),
        Format::Png => img.write_with_encoder(PngEncoder::new(&mut out)),
    }
    .map_err(RenderError::Encode)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn status(result: Result<impl std::fmt::Debug, RequestError>) -> u16 {
        match result {
            Ok(_) => 200,
            Err(err) => err.status().as_u16(),
        }
    }

    #[test]
    fn plain_names_pass() {
        for name in ["img-000.jpg", "a", "photo%20one.png", "caf%C3%A9.jpg", "a..b.jpg", "x.y.z"] {
            assert!(parse_image_name(name).is_ok(), "{name}");
        }
        assert_eq!(parse_image_name("photo%20one.png").ok().as_deref(), Some("photo one.png"));
    }

    #[test]
    fn escaping_names_are_rejected_after_decoding() {
        for name in [
            "",
            "..",
            ".",
            "%2e%2e",
            "%2E%2E",
            ".hidden.jpg",
            "../secret.jpg",
            "..%2Fsecret.jpg",
            "%2e%2e%2fsecret.jpg",
            "%2e%2e%5csecret.jpg",
            "..\\secret.jpg",
            "a%2Fb.jpg",
            "a%2fb.jpg",
            "/etc/passwd",
            "%2Fetc%2Fpasswd",
            "img.jpg%00",
            "img%0a.jpg",
            "C:%5Cwindows",
            "c:secret",
            "%ff%fe",
            "bad%2",
            "bad%zz",
            "%",
        ] {
            assert_eq!(status(parse_image_name(name)), 400, "{name:?} must be rejected");
        }
        let long = "a".repeat(256);
        assert_eq!(status(parse_image_name(&long)), 400);
        assert_eq!(status(parse_image_name(&long[..255])), 200);
    }

    #[test]
    fn sizes_are_validated() {
        assert_eq!(parse_size(Some("w=100&h=50"), 4096).ok(), Some((100, 50)));
        assert_eq!(parse_size(Some("h=50&x=1&w=4096&"), 4096).ok(), Some((4096, 50)));
        assert_eq!(parse_size(Some("%77=7&h=8"), 4096).ok(), Some((7, 8)));
        for query in [
            None,
            Some(""),
            Some("w=100"),
            Some("h=100"),
            Some("w=0&h=10"),
            Some("w=10&h=0"),
            Some("w=4097&h=10"),
            Some("w=5000&h=10"),
            Some("w=abc&h=10"),
            Some("w=-1&h=10"),
            Some("w=1.5&h=10"),
            Some("w=&h=10"),
            Some("w&h=10"),
            Some("w=99999999999999999999&h=10"),
            Some("w=10&w=20&h=10"),
            Some("w=%zz&h=1"),
        ] {
            assert_eq!(status(parse_size(query, 4096)), 400, "{query:?}");
        }
    }

    #[test]
    fn accept_picks_png_only_when_jpeg_is_not_named() {
        let format = |accept: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in accept {
                headers.append(ACCEPT, HeaderValue::from_str(value).expect("test header"));
            }
            Format::from_accept(&headers)
        };
        assert_eq!(format(&[]), Format::Jpeg);
        assert_eq!(format(&["*/*"]), Format::Jpeg);
        assert_eq!(format(&["image/png"]), Format::Png);
        assert_eq!(format(&["IMAGE/PNG, */*;q=0.1"]), Format::Png);
        assert_eq!(format(&["image/png, image/jpeg"]), Format::Jpeg);
        assert_eq!(format(&["image/png", "image/jpeg"]), Format::Jpeg);
        assert_eq!(format(&["image/webp"]), Format::Jpeg);
    }
}
