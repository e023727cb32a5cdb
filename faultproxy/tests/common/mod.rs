//! A tiny upstream HTTP server and a raw HTTP client, both on real sockets, so the tests see the
//! proxy's bytes exactly as a peer would.

#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use hydrant_fault_proxy::{start, Config, DelayRange, ProxyHandle};

/// The body bytes served for `/bytes/N`: a pattern that is not periodic at any power of two,
/// so that a dropped or repeated buffer shows up.
pub fn pattern(length: usize) -> Vec<u8> {
    (0..length).map(|index| (index % 251) as u8).collect()
}

/// The chunked encoding served for `/chunked/LENGTH/CHUNK`, with a trailer field.
pub fn chunked_encoding(payload: &[u8], chunk_bytes: usize) -> Vec<u8> {
    let mut encoded = Vec::new();
    for chunk in payload.chunks(chunk_bytes) {
        encoded.extend_from_slice(format!("{:x};ext=1\r\n", chunk.len()).as_bytes());
        encoded.extend_from_slice(chunk);
        encoded.extend_from_slice(b"\r\n");
    }
    encoded.extend_from_slice(b"0\r\nX-Trailer: done\r\n\r\n");
    encoded
}

/// An upstream server that counts what reaches it:
/// - `GET /bytes/N`: N pattern bytes with a Content-Length; `HEAD` the same head without body;
/// - `GET /chunked/N/M`: N pattern bytes in chunks of M, with a trailer;
/// - `GET /once/N`: as `/bytes/N` on a connection's first request, else closes unanswered;
/// - `PUT` and `POST` (any path): reads the body (length or chunked; answers `100 Continue`
///   first when asked) and answers `received N`;
/// - `DELETE` (any path): 204.
pub struct Upstream {
    pub address: SocketAddr,
    pub requests: Arc<AtomicU64>,
    pub connections: Arc<AtomicU64>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (thread_requests, thread_connections) = (requests.clone(), connections.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                thread_connections.fetch_add(1, Ordering::SeqCst);
                let requests = thread_requests.clone();
                thread::spawn(move || {
                    let _ = serve_upstream(stream, &requests);
                });
            }
        });
        Upstream {
            address,
            requests,
            connections,
        }
    }

    pub fn request_count(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn connection_count(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

struct Head {
    start_line: String,
    fields: Vec<(String, String)>,
}

impl Head {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

fn read_head(reader: &mut impl BufRead) -> io::Result<Option<Head>> {
    let mut start_line = String::new();
    if reader.read_line(&mut start_line)? == 0 {
        return Ok(None);
    }
    let mut fields = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        fields.push((name.to_string(), value.trim().to_string()));
    }
    Ok(Some(Head {
        start_line: start_line.trim_end().to_string(),
        fields,
    }))
}

/// Reads a body framed by the head's fields, decoding chunked; returns (payload, raw bytes).
fn read_body(
    reader: &mut impl BufRead,
    head: &Head,
    has_body: bool,
) -> io::Result<(Vec<u8>, Vec<u8>)> {
    if !has_body {
        return Ok((Vec::new(), Vec::new()));
    }
    let chunked = head
        .field("transfer-encoding")
        .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"));
    if chunked {
        let (mut payload, mut raw) = (Vec::new(), Vec::new());
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            raw.extend_from_slice(line.as_bytes());
            let size_text = line.trim_end().split(';').next().unwrap().to_string();
            let size = usize::from_str_radix(&size_text, 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
            if size == 0 {
                loop {
                    let mut trailer = String::new();
                    if reader.read_line(&mut trailer)? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    raw.extend_from_slice(trailer.as_bytes());
                    if trailer == "\r\n" {
                        return Ok((payload, raw));
                    }
                }
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            raw.extend_from_slice(&chunk);
            payload.extend_from_slice(&chunk[..size]);
        }
    }
    let length: usize = head
        .field("content-length")
        .map(|value| value.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((body.clone(), body))
}

fn serve_upstream(stream: TcpStream, requests: &AtomicU64) -> io::Result<()> {
    // Responses go out in several writes; without NODELAY, Nagle's algorithm would hold each
    // later write for the proxy's delayed acknowledgement and slow every request by some 40 ms.
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut served_here = 0;
    while let Some(head) = read_head(&mut reader)? {
        requests.fetch_add(1, Ordering::SeqCst);
        served_here += 1;
        let mut parts = head.start_line.split(' ');
        let (method, target) = (parts.next().unwrap(), parts.next().unwrap());
        let path = target.split('?').next().unwrap();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            ("GET" | "HEAD", ["bytes", length]) => {
                let length: usize = length.parse().unwrap();
                write!(
                    writer,
                    "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n"
                )?;
                if method == "GET" {
                    writer.write_all(&pattern(length))?;
                }
            }
            // Closes a kept connection on its second request without answering, as a server
            // does when its idle timeout strikes just as a request arrives.
            ("GET", ["once", _]) if served_here > 1 => return Ok(()),
            ("GET", ["once", length]) => {
                let length: usize = length.parse().unwrap();
                write!(
                    writer,
                    "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n"
                )?;
                writer.write_all(&pattern(length))?;
            }
            ("GET", ["chunked", length, chunk_bytes]) => {
                let body = chunked_encoding(
                    &pattern(length.parse().unwrap()),
                    chunk_bytes.parse().unwrap(),
                );
                writer.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")?;
                writer.write_all(&body)?;
            }
            ("PUT" | "POST", _) => {
                if head
                    .field("expect")
                    .is_some_and(|value| value.eq_ignore_ascii_case("100-continue"))
                {
                    writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
                }
                let (payload, _) = read_body(&mut reader, &head, true)?;
                let answer = format!("received {}", payload.len());
                write!(
                    writer,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                    answer.len()
                )?;
            }
            ("DELETE", _) => writer.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")?,
            _ => writer.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?,
        }
    }
    Ok(())
}

/// A response as the client read it.
pub struct Response {
    pub status: u16,
    fields: Vec<(String, String)>,
    /// The payload, chunked encoding decoded.
    pub body: Vec<u8>,
    /// The body as it came over the wire.
    pub raw_body: Vec<u8>,
}

impl Response {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw HTTP/1.1 client on one keep-alive connection.
pub struct Client {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(address: SocketAddr) -> Client {
        let stream = TcpStream::connect(address).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// Sends a request with a Content-Length body (none for GET, HEAD and DELETE without one).
    pub fn send(&mut self, method: &str, target: &str, body: &[u8]) -> io::Result<()> {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: s3.test\r\n");
        if !body.is_empty() || method == "PUT" || method == "POST" {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        self.writer.write_all(head.as_bytes())?;
        self.writer.write_all(body)
    }

    pub fn read_response(&mut self, request_is_head: bool) -> io::Result<Response> {
        let head = read_head(&mut self.reader)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let status: u16 = head.start_line.split(' ').nth(1).unwrap().parse().unwrap();
        let has_body =
            !request_is_head && !(100..200).contains(&status) && status != 204 && status != 304;
        let (body, raw_body) = read_body(&mut self.reader, &head, has_body)?;
        Ok(Response {
            status,
            fields: head.fields,
            body,
            raw_body,
        })
    }

    pub fn request(&mut self, method: &str, target: &str, body: &[u8]) -> io::Result<Response> {
        self.send(method, target, body)?;
        self.read_response(method == "HEAD")
    }

    pub fn get(&mut self, target: &str) -> io::Result<Response> {
        self.request("GET", target, &[])
    }
}

/// A proxy in front of `upstream` without delay, adjusted by `adjust`.
pub fn start_proxy(upstream: &Upstream, adjust: impl FnOnce(&mut Config)) -> ProxyHandle {
    let mut config = Config::new(upstream.address.to_string());
    config.settings.delay = DelayRange::NONE;
    adjust(&mut config);
    start(config).unwrap()
}
