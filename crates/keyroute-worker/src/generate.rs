//! Deterministic source images, so that a demo, a test or a benchmark has a corpus without
//! shipping one.
//!
//! Each image is a linear gradient between two colours in a random direction, a handful of
//! translucent discs, and per-pixel noise (which makes the JPEGs realistically hard to compress,
//! so resizing and encoding cost what they would on photos). Every number comes from SplitMix64
//! (Steele, Lea, Flood 2014) seeded from the caller's seed, and the painting uses integer
//! arithmetic only, so the pixels are identical on every platform; the files are identical for a
//! given version of the `image` crate's JPEG encoder.

use std::fs;
use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::{Rgb, RgbImage};

use crate::WorkerError;

/// The largest generated side; `16384 * 16384` RGB pixels are 768 MiB, about as much as a test
/// machine should allocate for one image.
const MAX_SIDE: u32 = 16_384;

/// The JPEG quality of generated sources: high, as for originals.
const SOURCE_QUALITY: u8 = 90;

/// Writes `count` procedural JPEG images of `width`x`height` pixels into `dir` (created if
/// missing), named `img-000.jpg`, `img-001.jpg`, ... (three digits or more), and returns their
/// file names in order.
///
/// The same `seed` (and sizes) gives byte-identical files; image `i` depends only on `seed` and
/// `i`, so a larger `count` extends a smaller one. Existing files of the same names are replaced,
/// each atomically (written to a temporary file, then renamed).
///
/// # Errors
///
/// [`WorkerError::Config`] when `width` or `height` is 0 or above 16384;
/// [`WorkerError::WriteImage`] when the directory or a file cannot be written;
/// [`WorkerError::EncodeImage`] if the encoder fails.
///
/// # Examples
///
/// ```
/// let dir = std::env::temp_dir().join(format!("keyroute-generate-doc-{}", std::process::id()));
/// let names = keyroute_worker::generate_images(&dir, 3, 64, 48, 1)?;
/// assert_eq!(names, ["img-000.jpg", "img-001.jpg", "img-002.jpg"]);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate_images(
    dir: &Path,
    count: usize,
    width: u32,
    height: u32,
    seed: u64,
) -> Result<Vec<String>, WorkerError> {
    for (field, side) in [("width", width), ("height", height)] {
        if side == 0 || side > MAX_SIDE {
            return Err(WorkerError::Config { field, reason: format!("must be from 1 to {MAX_SIDE}, got {side}") });
        }
    }
    fs::create_dir_all(dir).map_err(|source| WorkerError::WriteImage { path: dir.to_owned(), source })?;
    let mut seeds = SplitMix64(seed);
    let mut names = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("img-{i:03}.jpg");
        let path = dir.join(&name);
        let pixels = paint(width, height, seeds.next());
        let mut jpeg = Vec::new();
        pixels
            .write_with_encoder(JpegEncoder::new_with_quality(&mut jpeg, SOURCE_QUALITY))
            .map_err(|source| WorkerError::EncodeImage { path: path.clone(), source })?;
        // A leading dot: the worker refuses to serve a half-written file by this name.
        let temp = dir.join(format!(".{name}.tmp"));
        fs::write(&temp, &jpeg)
            .and_then(|()| fs::rename(&temp, &path))
            .map_err(|source| WorkerError::WriteImage { path: path.clone(), source })?;
        names.push(name);
    }
    Ok(names)
}

/// SplitMix64: a 64-bit state, an additive step and a finalizer; passes BigCrush and is the
/// usual seeder of other generators. Good enough for pictures, and trivially reproducible.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`); the modulo bias is irrelevant here.
    fn below(&mut self, n: u64) -> i64 {
        (self.next() % n.max(1)) as i64
    }

    fn color(&mut self) -> [i64; 3] {
        [self.below(256), self.below(256), self.below(256)]
    }
}

struct Disc {
    cx: i64,
    cy: i64,
    r2: i64,
    color: [i64; 3],
    /// Opacity out of 256.
    alpha: i64,
}

fn paint(width: u32, height: u32, seed: u64) -> RgbImage {
    let mut rng = SplitMix64(seed);
    let (w, h) = (i64::from(width), i64::from(height));
    let from = rng.color();
    let to = rng.color();
    // The gradient runs along the integer vector (dx, dy); its projection spans lo..=hi.
    let (mut dx, dy) = (rng.below(17) - 8, rng.below(17) - 8);
    if dx == 0 && dy == 0 {
        dx = 1;
    }
    let corners = [0, dx * (w - 1), dy * (h - 1), dx * (w - 1) + dy * (h - 1)];
    let lo = corners.iter().copied().min().unwrap_or(0);
    let hi = corners.iter().copied().max().unwrap_or(0);
    let span = (hi - lo).max(1);
    let discs: Vec<Disc> = (0..3 + rng.below(6))
        .map(|_| {
            let r = 4 + rng.below((w.min(h) / 3 + 1) as u64);
            Disc {
                cx: rng.below(w as u64),
                cy: rng.below(h as u64),
                r2: r * r,
                color: rng.color(),
                alpha: 96 + rng.below(129),
            }
        })
        .collect();
    let amplitude = 4 + rng.below(21);
    RgbImage::from_fn(width, height, |x, y| {
        let (x, y) = (i64::from(x), i64::from(y));
        let t = (dx * x + dy * y - lo) * 256 / span;
        let mut px: [i64; 3] = std::array::from_fn(|c| from[c] + (to[c] - from[c]) * t / 256);
        for disc in &discs {
            if (x - disc.cx).pow(2) + (y - disc.cy).pow(2) <= disc.r2 {
                for (p, &d) in px.iter_mut().zip(&disc.color) {
                    *p += (d - *p) * disc.alpha / 256;
                }
            }
        }
        let bits = rng.next();
        Rgb(std::array::from_fn(|c| {
            let noise = ((bits >> (16 * c)) & 0xffff) as i64 % (2 * amplitude + 1) - amplitude;
            (px[c] + noise).clamp(0, 255) as u8
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference() {
        // The reference C implementation (Vigna) seeded with 0 starts with these outputs.
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn painting_is_deterministic_and_seed_dependent() {
        let a = paint(40, 30, 9);
        assert_eq!(a, paint(40, 30, 9));
        assert_ne!(a, paint(40, 30, 10));
        assert_eq!(a.dimensions(), (40, 30));
        // A 1x1 image and a very thin one are fine too.
        assert_eq!(paint(1, 1, 3).dimensions(), (1, 1));
        assert_eq!(paint(500, 1, 3).dimensions(), (500, 1));
    }
}
