//! HTTP/1.1 message framing (RFC 9112): reading heads, deciding where a body ends, and copying a
//! body through verbatim. Heads are parsed only for what framing and connection management need;
//! the bytes forwarded are the bytes received.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::throttle::Throttle;

/// The largest request or response head accepted; larger request heads are answered with 431.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;

/// The receive buffer of each side of a connection, and so the most bytes relayed per write.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// The longest chunk-size line accepted (the size in hex plus chunk extensions).
pub const CHUNK_LINE_BYTES_MAX: usize = 4 * 1024;

const HEAD_TERMINATOR: &[u8] = b"\r\n\r\n";

/// Why a head could not be read.
#[derive(Debug)]
pub enum HeadError {
    TooLarge,
    /// The peer closed the connection part way through a head.
    Truncated,
    Io(io::ErrorKind),
}

impl From<io::Error> for HeadError {
    fn from(error: io::Error) -> Self {
        HeadError::Io(error.kind())
    }
}

/// The reading side of a connection, with a buffer that holds what was read past a head (the
/// start of the body, or a pipelined request) until it is needed.
pub struct Inbound {
    stream: TcpStream,
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Inbound {
    pub fn new(stream: TcpStream) -> Self {
        Inbound {
            stream,
            buffer: vec![0; READ_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// Bytes received but not yet consumed.
    pub fn buffered_bytes(&self) -> usize {
        self.end - self.start
    }

    /// Reads into the buffer, which must be empty; returns the bytes read, 0 at end of stream.
    fn fill(&mut self) -> io::Result<usize> {
        assert_eq!(
            self.start, self.end,
            "filling would overwrite unconsumed bytes"
        );
        self.start = 0;
        self.end = 0;
        let count = loop {
            match self.stream.read(&mut self.buffer) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                result => break result?,
            }
        };
        self.end = count;
        Ok(count)
    }

    /// Waits for at least one byte or the end of the stream, up to the stream's read timeout;
    /// `Ok(false)` when the timeout passed first.
    pub fn wait_for_data(&mut self) -> io::Result<bool> {
        if self.buffered_bytes() > 0 {
            return Ok(true);
        }
        match self.fill() {
            Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => Ok(true),
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Reads a head up to and including its blank line; `Ok(None)` if the stream ended cleanly
    /// before its first byte.
    pub fn read_head(&mut self) -> Result<Option<Vec<u8>>, HeadError> {
        let mut head = Vec::new();
        loop {
            if self.buffered_bytes() == 0 && self.fill()? == 0 {
                return match head.is_empty() {
                    true => Ok(None),
                    false => Err(HeadError::Truncated),
                };
            }
            // The terminator may straddle two reads, so the search starts three bytes back.
            let search_from = head.len().saturating_sub(HEAD_TERMINATOR.len() - 1);
            head.extend_from_slice(&self.buffer[self.start..self.end]);
            self.start = self.end;
            if let Some(position) = find(&head[search_from..], HEAD_TERMINATOR) {
                let head_end = search_from + position + HEAD_TERMINATOR.len();
                if head_end > HEAD_BYTES_MAX {
                    return Err(HeadError::TooLarge);
                }
                // Hand back what follows the head: it is body or the next request.
                self.start = self.end - (head.len() - head_end);
                head.truncate(head_end);
                return Ok(Some(head));
            }
            if head.len() > HEAD_BYTES_MAX {
                return Err(HeadError::TooLarge);
            }
        }
    }

    /// Reads a line up to and including its `\n`, of at most `bytes_max` bytes.
    pub fn read_line(&mut self, bytes_max: usize) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        loop {
            if self.buffered_bytes() == 0 && self.fill()? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let available = &self.buffer[self.start..self.end];
            let (taken, complete) = match available.iter().position(|&byte| byte == b'\n') {
                Some(position) => (position + 1, true),
                None => (available.len(), false),
            };
            line.extend_from_slice(&available[..taken]);
            self.start += taken;
            if line.len() > bytes_max {
                return Err(invalid_data("a chunk line exceeds its limit"));
            }
            if complete {
                return Ok(line);
            }
        }
    }

    /// Consumes up to `bytes_max` bytes, reading if none are buffered; empty at end of stream.
    pub fn read_available(&mut self, bytes_max: usize) -> io::Result<&[u8]> {
        if self.buffered_bytes() == 0 {
            self.fill()?;
        }
        let count = bytes_max.min(self.buffered_bytes());
        let bytes = &self.buffer[self.start..self.start + count];
        self.start += count;
        Ok(bytes)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

pub fn invalid_data(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Where a body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Only for responses without a length: the body ends when the server closes.
    UntilClose,
}

/// What framing and connection management need from the header fields of a head.
#[derive(Debug, Default)]
struct HeaderSummary {
    content_length: Option<u64>,
    /// The transfer codings, in order, lowercased.
    transfer_encoding: Vec<String>,
    connection_close: bool,
    connection_keep_alive: bool,
    expect_continue: bool,
}

impl HeaderSummary {
    fn chunked(&self) -> bool {
        self.transfer_encoding.last().map(String::as_str) == Some("chunked")
    }
}

/// Splits a head into its start line and a summary of its fields.
fn parse_head(bytes: &[u8]) -> Result<(&str, HeaderSummary), &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let start_line = lines.next().ok_or("the head is empty")?;
    let mut summary = HeaderSummary::default();
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line.split_once(':').ok_or("a header field has no colon")?;
        if name.is_empty() || name.contains([' ', '\t']) {
            return Err("a header field name is malformed");
        }
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("content-length") {
            let length: u64 = value
                .parse()
                .map_err(|_| "Content-Length is not a number")?;
            // Repeated lengths must agree (RFC 9112, section 6.3), or the framing is ambiguous.
            if summary
                .content_length
                .is_some_and(|earlier| earlier != length)
            {
                return Err("Content-Length values disagree");
            }
            summary.content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            summary.transfer_encoding.extend(
                value
                    .split(',')
                    .map(|coding| coding.trim().to_ascii_lowercase())
                    .filter(|coding| !coding.is_empty()),
            );
        } else if name.eq_ignore_ascii_case("connection") {
            for option in value.split(',').map(str::trim) {
                summary.connection_close |= option.eq_ignore_ascii_case("close");
                summary.connection_keep_alive |= option.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("expect") {
            summary.expect_continue |= value.eq_ignore_ascii_case("100-continue");
        }
    }
    Ok((start_line, summary))
}

fn parse_version(text: &str) -> Result<bool, &'static str> {
    match text {
        "HTTP/1.1" => Ok(true),
        "HTTP/1.0" => Ok(false),
        _ => Err("the HTTP version is not 1.0 or 1.1"),
    }
}

/// HTTP/1.1 keeps a connection open unless told to close; HTTP/1.0 closes it unless told to
/// keep it open.
fn keeps_alive(version_1_1: bool, summary: &HeaderSummary) -> bool {
    match version_1_1 {
        true => !summary.connection_close,
        false => summary.connection_keep_alive && !summary.connection_close,
    }
}

#[derive(Debug)]
pub struct RequestHead {
    /// The head as received, forwarded unchanged.
    pub bytes: Vec<u8>,
    pub method: String,
    /// The request target, such as `/bucket/key?partNumber=1`.
    pub target: String,
    pub framing: Framing,
    pub expect_continue: bool,
    pub keep_alive: bool,
}

impl RequestHead {
    pub fn parse(bytes: Vec<u8>) -> Result<Self, &'static str> {
        let (start_line, summary) = parse_head(&bytes)?;
        let mut parts = start_line.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("the request line is not METHOD TARGET VERSION");
        };
        if method.is_empty() || target.is_empty() {
            return Err("the request line is not METHOD TARGET VERSION");
        }
        let version_1_1 = parse_version(version)?;
        // A request's body is chunked or has a length; other codings cannot be framed (RFC 9112,
        // section 6.3), and chunked takes precedence over a length.
        let framing = if !summary.transfer_encoding.is_empty() {
            if !summary.chunked() {
                return Err("a request transfer coding other than chunked");
            }
            Framing::Chunked
        } else {
            match summary.content_length {
                None | Some(0) => Framing::Empty,
                Some(length) => Framing::Length(length),
            }
        };
        Ok(RequestHead {
            method: method.to_string(),
            target: target.to_string(),
            framing,
            expect_continue: summary.expect_continue && version_1_1,
            keep_alive: keeps_alive(version_1_1, &summary),
            bytes,
        })
    }

    /// The target without its query string.
    pub fn path(&self) -> &str {
        self.target
            .split_once('?')
            .map_or(self.target.as_str(), |(path, _)| path)
    }

    /// The query string, without the `?`; empty if there is none.
    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, query)| query)
    }

    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }
}

#[derive(Debug)]
pub struct ResponseHead {
    /// The head as received, relayed unchanged.
    pub bytes: Vec<u8>,
    pub status: u16,
    content_length: Option<u64>,
    chunked: bool,
    transfer_encoding_present: bool,
    pub keep_alive: bool,
}

impl ResponseHead {
    pub fn parse(bytes: Vec<u8>) -> Result<Self, &'static str> {
        let (start_line, summary) = parse_head(&bytes)?;
        let mut parts = start_line.splitn(3, ' ');
        let version_1_1 = parse_version(parts.next().unwrap_or(""))?;
        let status: u16 = parts
            .next()
            .and_then(|code| code.parse().ok())
            .filter(|code| (100..=999).contains(code))
            .ok_or("the status code is malformed")?;
        Ok(ResponseHead {
            status,
            content_length: summary.content_length,
            chunked: summary.chunked(),
            transfer_encoding_present: !summary.transfer_encoding.is_empty(),
            keep_alive: keeps_alive(version_1_1, &summary),
            bytes,
        })
    }

    /// A 1xx response, which precedes the final one.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status)
    }

    /// Where the body ends (RFC 9112, section 6.3): responses to HEAD and 1xx, 204 and 304
    /// responses have none whatever their fields say.
    pub fn framing(&self, request_is_head: bool) -> Framing {
        if request_is_head || self.is_interim() || self.status == 204 || self.status == 304 {
            return Framing::Empty;
        }
        if self.transfer_encoding_present {
            return match self.chunked {
                true => Framing::Chunked,
                false => Framing::UntilClose,
            };
        }
        match self.content_length {
            Some(0) => Framing::Empty,
            Some(length) => Framing::Length(length),
            None => Framing::UntilClose,
        }
    }
}

/// Parses the size of a chunk-size line such as `1a2b;name=value\r\n`.
pub fn parse_chunk_size(line: &[u8]) -> io::Result<u64> {
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or_else(|| invalid_data("a chunk line does not end in CRLF"))?;
    let size = line.split(|&byte| byte == b';').next().unwrap_or(&[]);
    let size = std::str::from_utf8(size)
        .map_err(|_| invalid_data("a chunk size is not ASCII"))?
        .trim_matches([' ', '\t']);
    if size.is_empty() || size.len() > 16 {
        return Err(invalid_data("a chunk size is empty or too long"));
    }
    u64::from_str_radix(size, 16).map_err(|_| invalid_data("a chunk size is not hexadecimal"))
}

/// How a copy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyEnd {
    Complete,
    /// Stopped after the cut, for a mid-body reset.
    Cut,
}

/// Copies one body from `from` to a writer, verbatim, through an optional throttle.
pub struct BodyCopy<'a> {
    pub throttle: Option<&'a Throttle>,
    /// Called with the count of each run of bytes written.
    pub record: &'a dyn Fn(u64),
    /// Stop after this many payload bytes (chunk framing not counted); `None` copies it all.
    pub cut_after_bytes: Option<u64>,
}

impl BodyCopy<'_> {
    /// A copy that only consumes a body, such as that of a faulted request.
    pub fn discard() -> BodyCopy<'static> {
        BodyCopy {
            throttle: None,
            record: &|_| {},
            cut_after_bytes: None,
        }
    }

    pub fn run(
        &self,
        framing: Framing,
        from: &mut Inbound,
        to: &mut impl Write,
    ) -> io::Result<CopyEnd> {
        let mut budget = self.cut_after_bytes;
        match framing {
            Framing::Empty => Ok(CopyEnd::Complete),
            Framing::Length(length) => self.copy_length(length, from, to, &mut budget),
            Framing::Chunked => self.copy_chunked(from, to, &mut budget),
            Framing::UntilClose => self.copy_until_close(from, to, &mut budget),
        }
    }

    fn forward(&self, bytes: &[u8], to: &mut impl Write) -> io::Result<()> {
        if let Some(throttle) = self.throttle {
            throttle.acquire(bytes.len() as u64);
        }
        // Counted before the write, so that a peer that has read the bytes finds them counted;
        // a failed write overcounts by at most one buffer.
        (self.record)(bytes.len() as u64);
        to.write_all(bytes)
    }

    fn copy_length(
        &self,
        length: u64,
        from: &mut Inbound,
        to: &mut impl Write,
        budget: &mut Option<u64>,
    ) -> io::Result<CopyEnd> {
        let mut remaining = length;
        while remaining > 0 {
            let mut limit = remaining.min(READ_BUFFER_BYTES as u64);
            if let Some(left) = *budget {
                if left == 0 {
                    return Ok(CopyEnd::Cut);
                }
                limit = limit.min(left);
            }
            let bytes = from.read_available(limit as usize)?;
            if bytes.is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let count = bytes.len() as u64;
            self.forward(bytes, to)?;
            remaining -= count;
            if let Some(left) = budget.as_mut() {
                *left -= count;
            }
        }
        Ok(CopyEnd::Complete)
    }

    fn copy_chunked(
        &self,
        from: &mut Inbound,
        to: &mut impl Write,
        budget: &mut Option<u64>,
    ) -> io::Result<CopyEnd> {
        loop {
            let line = from.read_line(CHUNK_LINE_BYTES_MAX)?;
            let size = parse_chunk_size(&line)?;
            self.forward(&line, to)?;
            if size == 0 {
                return self.copy_trailers(from, to);
            }
            if self.copy_length(size, from, to, budget)? == CopyEnd::Cut {
                return Ok(CopyEnd::Cut);
            }
            let end = from.read_line(CHUNK_LINE_BYTES_MAX)?;
            if end != b"\r\n" {
                return Err(invalid_data("chunk data is not followed by CRLF"));
            }
            self.forward(&end, to)?;
        }
    }

    /// Copies the trailer section after the last chunk, up to and including its blank line.
    fn copy_trailers(&self, from: &mut Inbound, to: &mut impl Write) -> io::Result<CopyEnd> {
        let mut trailer_bytes = 0;
        loop {
            let line = from.read_line(CHUNK_LINE_BYTES_MAX)?;
            trailer_bytes += line.len();
            if trailer_bytes > HEAD_BYTES_MAX {
                return Err(invalid_data(
                    "the chunked trailer section exceeds its limit",
                ));
            }
            self.forward(&line, to)?;
            if line == b"\r\n" {
                return Ok(CopyEnd::Complete);
            }
        }
    }

    fn copy_until_close(
        &self,
        from: &mut Inbound,
        to: &mut impl Write,
        budget: &mut Option<u64>,
    ) -> io::Result<CopyEnd> {
        loop {
            let mut limit = READ_BUFFER_BYTES as u64;
            if let Some(left) = *budget {
                if left == 0 {
                    return Ok(CopyEnd::Cut);
                }
                limit = limit.min(left);
            }
            let bytes = from.read_available(limit as usize)?;
            if bytes.is_empty() {
                return Ok(CopyEnd::Complete);
            }
            let count = bytes.len() as u64;
            self.forward(bytes, to)?;
            if let Some(left) = budget.as_mut() {
                *left -= count;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_parse_framing_and_connection_options() {
        let head = RequestHead::parse(
            b"PUT /bucket/key?x=1 HTTP/1.1\r\nHost: s3\r\ncontent-length: 5\r\nExpect: 100-continue\r\n\r\n"
                .to_vec(),
        )
        .unwrap();
        assert_eq!(head.method, "PUT");
        assert_eq!(head.path(), "/bucket/key");
        assert_eq!(head.query(), "x=1");
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.expect_continue);
        assert!(head.keep_alive);

        let chunked = RequestHead::parse(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
                .to_vec(),
        )
        .unwrap();
        assert_eq!(chunked.framing, Framing::Chunked);
        assert!(!chunked.keep_alive);

        let old = RequestHead::parse(b"GET / HTTP/1.0\r\n\r\n".to_vec()).unwrap();
        assert!(!old.keep_alive);
        assert_eq!(old.framing, Framing::Empty);

        assert!(RequestHead::parse(b"GET / HTTP/2\r\n\r\n".to_vec()).is_err());
        assert!(RequestHead::parse(b"GET /\r\n\r\n".to_vec()).is_err());
        assert!(RequestHead::parse(
            b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n".to_vec()
        )
        .is_err());
        assert!(
            RequestHead::parse(b"PUT / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec())
                .is_err()
        );
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let response = |text: &str| ResponseHead::parse(text.as_bytes().to_vec()).unwrap();
        let with_length = response("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
        assert_eq!(with_length.framing(false), Framing::Length(10));
        assert_eq!(with_length.framing(true), Framing::Empty);
        assert_eq!(
            response("HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n").framing(false),
            Framing::Empty
        );
        assert_eq!(
            response("HTTP/1.1 304 Not Modified\r\n\r\n").framing(false),
            Framing::Empty
        );
        assert_eq!(
            response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").framing(false),
            Framing::Chunked
        );
        let until_close = response("HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(until_close.framing(false), Framing::UntilClose);
        assert!(!until_close.keep_alive);
        assert!(response("HTTP/1.1 100 Continue\r\n\r\n").is_interim());
        assert!(ResponseHead::parse(b"HTTP/1.1 2000 OK\r\n\r\n".to_vec()).is_err());
    }

    #[test]
    fn chunk_sizes_parse_with_extensions() {
        assert_eq!(parse_chunk_size(b"1a\r\n").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"FF;name=value\r\n").unwrap(), 255);
        assert_eq!(parse_chunk_size(b"0\r\n").unwrap(), 0);
        assert!(parse_chunk_size(b"\r\n").is_err());
        assert!(parse_chunk_size(b"zz\r\n").is_err());
        assert!(parse_chunk_size(b"10").is_err());
        assert!(parse_chunk_size(b"11111111111111111\r\n").is_err());
    }
}
