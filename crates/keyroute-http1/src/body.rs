//! Bodies: where one ends ([`BodyDecoder`], over bytes as they arrive) and how one is framed on
//! the way out ([`chunk_header`], [`LAST_CHUNK`]).
//!
//! The chunked decoder (RFC 9112 section 7.1) is a state machine over bytes that never looks
//! back, so a body is decoded in whatever pieces the socket gives, without buffering it. It is as
//! strict as the heads: a chunk size is 1 to 16 hex digits; whitespace may follow it only before
//! an extension; every line ends in CRLF (a bare LF or CR is an error); an extension line and the
//! trailer section have limits ([`MAX_CHUNK_LINE`], [`MAX_TRAILERS`]). Extensions are read and
//! dropped; so are trailer fields (a proxy that re-frames a body may, RFC 9112 section 7.1.2).

use std::io;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};

use crate::head::Framing;

/// The longest chunk-size line (size, extensions, CRLF).
pub const MAX_CHUNK_LINE: usize = 4096;

/// The longest trailer section.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// The last chunk and an empty trailer section: the end of a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Why a body could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// A malformed chunk size, extension, line end or trailer.
    Chunk,
    /// A chunk line or the trailers are longer than their limit.
    TooLong,
    /// The connection closed before the body ended.
    Truncated,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BodyError::Chunk => "malformed chunked framing",
            BodyError::TooLong => "a chunk line or the trailers exceed their limit",
            BodyError::Truncated => "the connection closed before the body ended",
        })
    }
}

impl std::error::Error for BodyError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// Reading the size's hex digits (`digits` so far).
    Size { size: u64, digits: u8 },
    /// After the digits: whitespace, then `;` or CR.
    SizeWs { size: u64 },
    /// In an extension, until CR.
    Ext { size: u64 },
    /// The LF of the size line.
    SizeLf { size: u64 },
    /// `left` bytes of data.
    Data { left: u64 },
    /// The CR after a chunk's data.
    DataCr,
    /// Its LF.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// In a trailer field's name, until its colon.
    TrailerName,
    /// In a trailer field's value, until CR.
    Trailer,
    /// A trailer line's LF.
    TrailerLf,
    /// The final empty line's LF.
    EndLf,
    /// Done.
    Done,
}

/// A chunked body's decoder. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct ChunkedDecoder {
    state: Chunk,
    /// Bytes of the current size line, or of the trailers so far.
    line: usize,
}

/// What one step of the chunked decoder found in its input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Framing bytes up to `skip` consumed, then `len` bytes of data.
    Data {
        /// Framing bytes before the data.
        skip: usize,
        /// Data bytes (at most what the input holds).
        len: usize,
    },
    /// All the input was framing: consumed, more is needed.
    More,
    /// The body ended after this many bytes of the input (what follows is the next message's).
    End(usize),
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder { state: Chunk::Size { size: 0, digits: 0 }, line: 0 }
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.state == Chunk::Done
    }

    /// Consumes framing bytes from the start of `input` until data, the end, or the end of the
    /// input.
    ///
    /// # Errors
    ///
    /// The framing is malformed or too long; the body cannot go on.
    pub fn step(&mut self, input: &[u8]) -> Result<Step, BodyError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            self.state = match self.state {
                Chunk::Data { left } => {
                    let len = (input.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    let left = left - len as u64;
                    self.state = if left == 0 { Chunk::DataCr } else { Chunk::Data { left } };
                    return Ok(Step::Data { skip: i, len });
                }
                Chunk::Done => return Ok(Step::End(i)),
                state => self.byte(state, b)?,
            };
            i += 1;
            if self.state == Chunk::Done {
                return Ok(Step::End(i));
            }
        }
        Ok(Step::More)
    }

    fn byte(&mut self, state: Chunk, b: u8) -> Result<Chunk, BodyError> {
        let in_line =
            matches!(state, Chunk::Size { .. } | Chunk::SizeWs { .. } | Chunk::Ext { .. } | Chunk::SizeLf { .. });
        let in_trailers = matches!(
            state,
            Chunk::TrailerStart | Chunk::TrailerName | Chunk::Trailer | Chunk::TrailerLf | Chunk::EndLf
        );
        if in_line || in_trailers {
            self.line += 1;
            let limit = if in_line { MAX_CHUNK_LINE } else { MAX_TRAILERS };
            if self.line > limit {
                return Err(BodyError::TooLong);
            }
        }
        Ok(match state {
            Chunk::Size { size, digits } => match hex(b) {
                Some(d) if digits < 16 => Chunk::Size { size: size << 4 | u64::from(d), digits: digits + 1 },
                Some(_) => return Err(BodyError::Chunk),
                None if digits == 0 => return Err(BodyError::Chunk),
                None => self.after_size(size, b)?,
            },
            Chunk::SizeWs { size } => self.after_size(size, b)?,
            Chunk::Ext { size } => match b {
                b'\r' => Chunk::SizeLf { size },
                b'\t' | b' '..=b'~' | 0x80..=0xff => Chunk::Ext { size },
                _ => return Err(BodyError::Chunk),
            },
            Chunk::SizeLf { size } => match b {
                b'\n' if size == 0 => {
                    self.line = 0;
                    Chunk::TrailerStart
                }
                b'\n' => {
                    self.line = 0;
                    Chunk::Data { left: size }
                }
                _ => return Err(BodyError::Chunk),
            },
            Chunk::DataCr => match b {
                b'\r' => Chunk::DataLf,
                _ => return Err(BodyError::Chunk),
            },
            Chunk::DataLf => match b {
                b'\n' => Chunk::Size { size: 0, digits: 0 },
                _ => return Err(BodyError::Chunk),
            },
            Chunk::TrailerStart => match b {
                b'\r' => Chunk::EndLf,
                // A trailer field line is `token ":" value` (RFC 9110 section 5.1).
                b if is_token(b) => Chunk::TrailerName,
                _ => return Err(BodyError::Chunk),
            },
            Chunk::TrailerName => match b {
                b':' => Chunk::Trailer,
                b if is_token(b) => Chunk::TrailerName,
                _ => return Err(BodyError::Chunk),
            },
            Chunk::Trailer => match b {
                b'\r' => Chunk::TrailerLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff => Chunk::Trailer,
                _ => return Err(BodyError::Chunk),
            },
            Chunk::TrailerLf => match b {
                b'\n' => Chunk::TrailerStart,
                _ => return Err(BodyError::Chunk),
            },
            Chunk::EndLf => match b {
                b'\n' => Chunk::Done,
                _ => return Err(BodyError::Chunk),
            },
            Chunk::Data { .. } | Chunk::Done => state,
        })
    }

    fn after_size(&mut self, size: u64, b: u8) -> Result<Chunk, BodyError> {
        Ok(match b {
            b' ' | b'\t' => Chunk::SizeWs { size },
            b';' => Chunk::Ext { size },
            b'\r' => Chunk::SizeLf { size },
            _ => return Err(BodyError::Chunk),
        })
    }
}

/// A `tchar` (RFC 9110 section 5.6.2).
fn is_token(b: u8) -> bool {
    matches!(b, b'!' | b'#'..=b'\'' | b'*' | b'+' | b'-' | b'.' | b'0'..=b'9' | b'A'..=b'Z' | b'^'..=b'z' | b'|' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A body being read: its framing, and how far it has got.
#[derive(Clone, Debug)]
pub enum BodyDecoder {
    /// `left` bytes still to come.
    Length(u64),
    /// A chunked body.
    Chunked(ChunkedDecoder),
    /// Everything until the connection closes.
    UntilClose,
    /// Ended.
    Done,
}

/// What a body decoder made of the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Body data (a slice of the input: nothing copied).
    Data(Bytes),
    /// The input is used up; read more.
    More,
    /// The body has ended; what is left in the input is the next message's.
    End,
}

impl BodyDecoder {
    /// The decoder for a message framed as `framing`.
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => BodyDecoder::Done,
            Framing::Length(n) => BodyDecoder::Length(n),
            Framing::Chunked => BodyDecoder::Chunked(ChunkedDecoder::new()),
            Framing::UntilClose => BodyDecoder::UntilClose,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        matches!(self, BodyDecoder::Done)
    }

    /// The bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            BodyDecoder::Length(n) => Some(*n),
            BodyDecoder::Done => Some(0),
            _ => None,
        }
    }

    /// Takes the next piece of body from the front of `input`.
    ///
    /// # Errors
    ///
    /// Malformed chunked framing.
    pub fn next(&mut self, input: &mut Bytes) -> Result<Next, BodyError> {
        match self {
            BodyDecoder::Done => Ok(Next::End),
            BodyDecoder::Length(left) => {
                if input.is_empty() {
                    return Ok(Next::More);
                }
                let take = (input.len() as u64).min(*left) as usize;
                *left -= take as u64;
                let data = input.split_to(take);
                if *left == 0 {
                    *self = BodyDecoder::Done;
                }
                Ok(Next::Data(data))
            }
            BodyDecoder::UntilClose => {
                if input.is_empty() {
                    return Ok(Next::More);
                }
                Ok(Next::Data(input.split_to(input.len())))
            }
            BodyDecoder::Chunked(c) => match c.step(input)? {
                Step::Data { skip, len } => {
                    input.advance(skip);
                    Ok(Next::Data(input.split_to(len)))
                }
                Step::More => {
                    input.clear();
                    Ok(Next::More)
                }
                Step::End(n) => {
                    input.advance(n);
                    *self = BodyDecoder::Done;
                    Ok(Next::End)
                }
            },
        }
    }

    /// Consumes the framing bytes at the front of `input` (up to data), so that a body whose
    /// last chunk has already arrived is seen to end without another read.
    ///
    /// # Errors
    ///
    /// Malformed chunked framing.
    pub fn settle(&mut self, input: &mut Bytes) -> Result<(), BodyError> {
        if let BodyDecoder::Chunked(c) = self
            && !input.is_empty()
        {
            // Data stays in the input: the decoder's state already counts it as to come.
            match c.step(input)? {
                Step::Data { skip, len } => {
                    input.advance(skip);
                    // Give the data back to the decoder's count: it was not taken.
                    let left = match c.state {
                        Chunk::Data { left } => left,
                        _ => 0,
                    };
                    c.state = Chunk::Data { left: left + len as u64 };
                }
                Step::More => input.clear(),
                Step::End(n) => {
                    input.advance(n);
                    *self = BodyDecoder::Done;
                }
            }
        }
        Ok(())
    }

    /// The body ended because the connection closed: fine for [`BodyDecoder::UntilClose`].
    ///
    /// # Errors
    ///
    /// [`BodyError::Truncated`] for a body that had more to come.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        match self {
            BodyDecoder::UntilClose | BodyDecoder::Done => {
                *self = BodyDecoder::Done;
                Ok(())
            }
            _ => Err(BodyError::Truncated),
        }
    }
}

/// Why [`BodyDecoder::poll_data`] stopped short.
#[derive(Debug)]
pub enum PollError {
    /// The framing was malformed, or the connection closed before the body ended
    /// ([`BodyError::Truncated`]).
    Framing(BodyError),
    /// The transport failed.
    Io(io::Error),
}

impl BodyDecoder {
    /// The next piece of body: from `buffered` first, then from `read` (a read of the
    /// connection, empty at its end) as `buffered` runs out; `None` once the body has ended. The
    /// one decode-and-read loop of both sides' bodies.
    ///
    /// # Errors
    ///
    /// See [`PollError`]; the body cannot go on after one.
    pub fn poll_data(
        &mut self,
        buffered: &mut Bytes,
        cx: &mut Context<'_>,
        mut read: impl FnMut(&mut Context<'_>) -> Poll<io::Result<Bytes>>,
    ) -> Poll<Option<Result<Bytes, PollError>>> {
        loop {
            match self.next(buffered) {
                Err(e) => return Poll::Ready(Some(Err(PollError::Framing(e)))),
                Ok(Next::End) => return Poll::Ready(None),
                Ok(Next::Data(d)) => {
                    if let Err(e) = self.settle(buffered) {
                        return Poll::Ready(Some(Err(PollError::Framing(e))));
                    }
                    if !d.is_empty() {
                        return Poll::Ready(Some(Ok(d)));
                    }
                }
                Ok(Next::More) => match ready!(read(cx)) {
                    Ok(b) if b.is_empty() => {
                        return Poll::Ready(match self.eof() {
                            Ok(()) => None,
                            Err(e) => Some(Err(PollError::Framing(e))),
                        });
                    }
                    Ok(b) => *buffered = b,
                    Err(e) => return Poll::Ready(Some(Err(PollError::Io(e)))),
                },
            }
        }
    }
}

/// The size line of a chunk of `len` bytes: hex digits and CRLF, in `out` (at most 18 bytes).
pub fn chunk_header(len: usize, out: &mut [u8; 18]) -> &[u8] {
    let digits = if len == 0 { 1 } else { (usize::BITS - len.leading_zeros()).div_ceil(4) as usize };
    for (i, slot) in out[..digits].iter_mut().enumerate() {
        let shift = 4 * (digits - 1 - i);
        *slot = b"0123456789abcdef"[(len >> shift) & 0xf];
    }
    out[digits] = b'\r';
    out[digits + 1] = b'\n';
    &out[..digits + 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `piece` bytes; the data and what was left after the end.
    fn decode(input: &[u8], piece: usize) -> Result<(Vec<u8>, Vec<u8>), BodyError> {
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut out = Vec::new();
        let mut left = Vec::new();
        let mut ended = false;
        for part in input.chunks(piece) {
            let mut b = Bytes::copy_from_slice(part);
            if ended {
                left.extend_from_slice(&b);
                continue;
            }
            loop {
                match d.next(&mut b)? {
                    Next::Data(x) => out.extend_from_slice(&x),
                    Next::More => break,
                    Next::End => {
                        ended = true;
                        left.extend_from_slice(&b);
                        break;
                    }
                }
            }
        }
        if !ended {
            d.eof()?;
        }
        Ok((out, left))
    }

    #[test]
    fn chunks_in_any_pieces() {
        let body = b"5\r\nhello\r\n6;ext=1;q=\"a b\"\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nGET";
        for piece in 1..body.len() {
            let (data, left) = decode(body, piece).expect("valid");
            assert_eq!((&data[..], &left[..]), (&b"hello world"[..], &b"GET"[..]), "{piece}");
        }
    }

    #[test]
    fn rfc_9112_chunk_corner_cases() {
        for bad in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",         // bare LF after the size
            b"5\r\nhello\n0\r\n\r\n",         // bare LF after the data
            b"5\r\nhelloXX0\r\n\r\n",         // data longer than its size
            b"-5\r\nhello\r\n0\r\n\r\n",      // a sign
            b"0x5\r\nhello\r\n0\r\n\r\n",     // a prefix
            b"11111111111111111\r\n",         // 17 digits
            b"5 x\r\nhello\r\n0\r\n\r\n",     // junk after whitespace
            b"5;a\x01\r\nhello\r\n0\r\n\r\n", // a CTL in an extension
            b"0\r\n: no name\r\n\r\n",        // a trailer without a name
            b"0\r\nTT H\r\n\r\n",             // a trailer without a colon (found by the differential test)
            b"0\r\nT T: 1\r\n\r\n",           // a space in a trailer's name
            b"0\r\nX: a\rb\r\n\r\n",          // a bare CR in a trailer
            b"0\r\n\n",                       // a bare LF ending the body
        ] {
            assert!(decode(bad, bad.len()).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(decode(b"5 ;x\r\nhello\r\n0\r\n\r\n", 3).expect("BWS before an extension").0, b"hello");
        assert_eq!(decode(b"A\r\n0123456789\r\n0\r\n\r\n", 4).expect("upper-case hex").0, b"0123456789");
        assert_eq!(decode(b"5\r\nhel", 64), Err(BodyError::Truncated));
        let long = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
        assert_eq!(decode(long.as_bytes(), 64), Err(BodyError::TooLong));
        let trailers = format!("0\r\n{}\r\n\r\n", "x: y\r\n".repeat(MAX_TRAILERS / 6 + 1));
        assert_eq!(decode(trailers.as_bytes(), 64), Err(BodyError::TooLong));
    }

    #[test]
    fn settle_sees_the_end_without_taking_data() {
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut b = Bytes::from_static(b"3\r\nabc\r\n0\r\n\r\n");
        d.settle(&mut b).expect("valid");
        assert_eq!(&b[..], b"abc\r\n0\r\n\r\n");
        assert_eq!(d.next(&mut b), Ok(Next::Data(Bytes::from_static(b"abc"))));
        d.settle(&mut b).expect("valid");
        assert!(d.is_done() && b.is_empty());
    }

    #[test]
    fn lengths_and_close() {
        let mut d = BodyDecoder::new(Framing::Length(3));
        let mut b = Bytes::from_static(b"abcdef");
        assert_eq!(d.next(&mut b), Ok(Next::Data(Bytes::from_static(b"abc"))));
        assert!(d.is_done());
        assert_eq!(&b[..], b"def");
        let mut d = BodyDecoder::new(Framing::Length(3));
        assert_eq!(d.next(&mut Bytes::from_static(b"ab")), Ok(Next::Data(Bytes::from_static(b"ab"))));
        assert_eq!(d.eof(), Err(BodyError::Truncated));
        let mut d = BodyDecoder::new(Framing::UntilClose);
        assert_eq!(d.eof(), Ok(()));
    }

    #[test]
    fn chunk_headers_are_lowercase_hex() {
        let mut buf = [0u8; 18];
        assert_eq!(chunk_header(0, &mut buf), b"0\r\n");
        assert_eq!(chunk_header(255, &mut buf), b"ff\r\n");
        assert_eq!(chunk_header(4096, &mut buf), b"1000\r\n");
        assert_eq!(chunk_header(usize::MAX, &mut buf).len(), usize::BITS as usize / 4 + 2);
    }
}
