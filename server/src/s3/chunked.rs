//! Bodies sent as `aws-chunked` without signatures (`x-amz-content-sha256:
//! STREAMING-UNSIGNED-PAYLOAD-TRAILER`), which SDKs send to carry a checksum in a trailer after
//! the body. s3s decodes such bodies only for requests it verified with a key; an endpoint
//! without keys decodes them here:
//!
//! ```text
//! <size in hex>[;extensions]\r\n<size bytes>\r\n ... 0\r\n<name>:<value>\r\n ... \r\n
//! ```
//!
//! The data passes through as slices of the pieces that arrived (no copy); the trailer's
//! headers are kept for the body's check, which compares the checksum they carry once the body
//! has ended. Anything else is a framing error, answered IncompleteBody: nothing is stored.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use hyper::header::{HeaderName, HeaderValue};
use hyper::HeaderMap;

/// Bytes of one line of the framing at most (a chunk's size line, one trailer header).
pub(super) const CHUNKED_LINE_BYTES_MAX: usize = 4096;
/// Bytes of the trailer at most, all its lines together.
pub(super) const CHUNKED_TRAILER_BYTES_MAX: usize = 16 << 10;

/// The headers a decoded body's trailer carried, once it has ended.
pub(super) type DecodedTrailer = Arc<Mutex<Option<HeaderMap>>>;

enum Phase {
    /// Reading a chunk's size line.
    Size,
    /// In a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// Reading the trailer's lines, this many bytes so far.
    Trailer(usize),
    Done,
}

struct Decoder {
    input: BoxStream<'static, Result<Bytes, s3s::StdError>>,
    /// What arrived and is not yet decoded.
    pending: Bytes,
    /// A line begun in an earlier piece.
    line: Vec<u8>,
    phase: Phase,
    headers: HeaderMap,
    trailer: DecodedTrailer,
}

fn framing(message: impl Into<String>) -> s3s::StdError {
    format!("aws-chunked body: {}", message.into()).into()
}

impl Decoder {
    /// The next line of the framing, without its CRLF; `None` when more input is needed.
    fn take_line(&mut self) -> Result<Option<Vec<u8>>, s3s::StdError> {
        match self.pending.iter().position(|&byte| byte == b'\n') {
            Some(end) => {
                let piece = self.pending.split_to(end + 1);
                self.line.extend_from_slice(&piece);
                let mut line = std::mem::take(&mut self.line);
                if line.len() > CHUNKED_LINE_BYTES_MAX || !line.ends_with(b"\r\n") {
                    return Err(framing("a line of the framing is malformed or too long"));
                }
                line.truncate(line.len() - 2);
                Ok(Some(line))
            }
            None => {
                self.line.extend_from_slice(&self.pending);
                self.pending = Bytes::new();
                if self.line.len() > CHUNKED_LINE_BYTES_MAX {
                    return Err(framing("a line of the framing is too long"));
                }
                Ok(None)
            }
        }
    }

    /// The next piece of data, `None` at the end of the body.
    async fn next(&mut self) -> Option<Result<Bytes, s3s::StdError>> {
        loop {
            if matches!(self.phase, Phase::Done) {
                return None;
            }
            if self.pending.is_empty() {
                match self.input.next().await {
                    Some(Ok(piece)) => self.pending = piece,
                    Some(Err(error)) => return Some(Err(error)),
                    None => return Some(Err(framing("the body ended before its last chunk"))),
                }
            }
            match self.phase {
                Phase::Data(left) => {
                    let take = left.min(self.pending.len() as u64);
                    let data = self.pending.split_to(take as usize);
                    self.phase = if take == left {
                        Phase::DataEnd
                    } else {
                        Phase::Data(left - take)
                    };
                    return Some(Ok(data));
                }
                Phase::Size => match self.take_line() {
                    Ok(None) => {}
                    Ok(Some(line)) => match chunk_size(&line) {
                        Some(0) => self.phase = Phase::Trailer(0),
                        Some(size) => self.phase = Phase::Data(size),
                        None => return Some(Err(framing("a chunk's size is not hexadecimal"))),
                    },
                    Err(error) => return Some(Err(error)),
                },
                Phase::DataEnd => match self.take_line() {
                    Ok(None) => {}
                    Ok(Some(line)) if line.is_empty() => self.phase = Phase::Size,
                    Ok(Some(_)) => {
                        return Some(Err(framing("a chunk is longer than its size says")))
                    }
                    Err(error) => return Some(Err(error)),
                },
                Phase::Trailer(so_far) => match self.take_line() {
                    Ok(None) => {}
                    Ok(Some(line)) if line.is_empty() => {
                        let headers = std::mem::take(&mut self.headers);
                        *self
                            .trailer
                            .lock()
                            .unwrap_or_else(|poison| poison.into_inner()) = Some(headers);
                        self.phase = Phase::Done;
                    }
                    Ok(Some(line)) => {
                        let so_far = so_far + line.len() + 2;
                        if so_far > CHUNKED_TRAILER_BYTES_MAX {
                            return Some(Err(framing("the trailer is too long")));
                        }
                        if let Err(error) = self.add_header(&line) {
                            return Some(Err(error));
                        }
                        self.phase = Phase::Trailer(so_far);
                    }
                    Err(error) => return Some(Err(error)),
                },
                Phase::Done => return None,
            }
        }
    }

    fn add_header(&mut self, line: &[u8]) -> Result<(), s3s::StdError> {
        let colon = line
            .iter()
            .position(|&byte| byte == b':')
            .ok_or_else(|| framing("a trailer line is not NAME:VALUE"))?;
        let name = HeaderName::from_bytes(line[..colon].trim_ascii())
            .map_err(|_| framing("a trailer's name is not a header name"))?;
        let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii())
            .map_err(|_| framing("a trailer's value is not a header value"))?;
        self.headers.append(name, value);
        Ok(())
    }
}

/// The size of a chunk from its line: hexadecimal, before any `;extension`.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.split(|&byte| byte == b';').next()?.trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// The data of an unsigned `aws-chunked` body, and where its trailer's headers will be once
/// the data has been read to its end.
pub(super) fn decode(
    input: BoxStream<'static, Result<Bytes, s3s::StdError>>,
) -> (
    BoxStream<'static, Result<Bytes, s3s::StdError>>,
    DecodedTrailer,
) {
    let trailer: DecodedTrailer = Arc::new(Mutex::new(None));
    let decoder = Decoder {
        input,
        pending: Bytes::new(),
        line: Vec::new(),
        phase: Phase::Size,
        headers: HeaderMap::new(),
        trailer: trailer.clone(),
    };
    let data = futures::stream::unfold(decoder, |mut decoder| async move {
        decoder.next().await.map(|piece| (piece, decoder))
    })
    .boxed();
    (data, trailer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode `body` delivered in pieces of `piece` bytes: the data and the trailer, or the
    /// error.
    fn decoded(body: &[u8], piece: usize) -> Result<(Vec<u8>, Option<HeaderMap>), String> {
        let pieces: Vec<Result<Bytes, s3s::StdError>> = body
            .chunks(piece.max(1))
            .map(|part| Ok(Bytes::copy_from_slice(part)))
            .collect();
        let (mut data, trailer) = decode(futures::stream::iter(pieces).boxed());
        let mut out = Vec::new();
        futures::executor::block_on(async {
            while let Some(part) = data.next().await {
                out.extend_from_slice(&part.map_err(|error| error.to_string())?);
            }
            Ok::<(), String>(())
        })?;
        let trailer = trailer.lock().unwrap().take();
        Ok((out, trailer))
    }

    #[test]
    fn data_and_trailer_come_out_whatever_the_pieces() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n";
        for piece in [1, 2, 3, 7, 64] {
            let (data, trailer) = decoded(body, piece).unwrap();
            assert_eq!(data, b"hello world", "pieces of {piece}");
            let trailer = trailer.expect("the trailer");
            assert_eq!(trailer["x-amz-checksum-crc32"], "DUoRhQ==");
        }
    }

    #[test]
    fn framing_errors_are_errors_not_data() {
        for (body, what) in [
            (&b"5\r\nhello"[..], "cut in a chunk"),
            (b"5\r\nhello\r\n", "no last chunk"),
            (b"5\r\nhelloXX\r\n0\r\n\r\n", "a chunk longer than its size"),
            (b"zz\r\nhello\r\n0\r\n\r\n", "a size that is not hex"),
            (
                b"5\r\nhello\r\n0\r\nno colon\r\n\r\n",
                "a trailer line without a colon",
            ),
            (
                b"0\r\nx-amz-checksum-crc32:AAAA\r\n",
                "a trailer never ended",
            ),
        ] {
            assert!(decoded(body, 3).is_err(), "{what}");
        }
        let long = format!("{}\r\n", "1".repeat(CHUNKED_LINE_BYTES_MAX + 1));
        assert!(
            decoded(long.as_bytes(), 100).is_err(),
            "a size line too long"
        );
        let mut trailer = b"0\r\n".to_vec();
        for index in 0..1000 {
            trailer
                .extend_from_slice(format!("x-amz-meta-{index}:{}\r\n", "v".repeat(20)).as_bytes());
        }
        trailer.extend_from_slice(b"\r\n");
        assert!(decoded(&trailer, 4096).is_err(), "a trailer too long");
    }
}
