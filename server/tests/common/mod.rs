//! What the whole-system tests of the server share: the real `hydrant-server` process, raw
//! frames built with hydrant-proto, a local S3-compatible server (moto's), and the server's RSS.
#![allow(dead_code)] // each test file uses a part of this

pub mod stores;
#[allow(unused_imports)] // each test file uses a part of this
pub use stores::{Kind, S3Server, Store};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hydrant_proto::message::{HelloRequest, HelloResponse, Message};
use hydrant_proto::{FrameHeader, Limits, Opcode, Status, FRAME_HEADER_BYTES};

/// A scratch folder under the target directory, empty, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        Scratch(directory)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `hydrant-server`, killed when dropped.
pub struct ServerProcess {
    pub child: Child,
    pub address: String,
    /// Where its S3 endpoint listens, when it has one.
    pub s3_address: Option<String>,
}

impl ServerProcess {
    /// The server on `directory/data.hyd` of `data_mib` MiB with two shards, plus `extra` flags
    /// and environment.
    pub fn start(directory: &Path, data_mib: u64, extra: &[&str], env: &[(&str, String)]) -> Self {
        ServerProcess::start_shards(directory, 2, data_mib, extra, env)
    }

    pub fn start_shards(
        directory: &Path,
        shards: usize,
        data_mib: u64,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hydrant-server"));
        command
            .args(["--listen", "127.0.0.1:0", "--shards", &shards.to_string()])
            .arg("--data")
            .arg(format!(
                "{}:{data_mib}MiB",
                directory.join("data.hyd").display()
            ))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        if !extra.contains(&"--s3-listen") {
            command.args(["--s3-listen", "off"]);
        }
        let mut child = command.spawn().expect("start hydrant-server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("the server prints where it listens, got {line:?}"))
            .to_string();
        let s3_address = line
            .split("S3 on http://")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .map(|address| address.trim().to_string());
        ServerProcess {
            child,
            address,
            s3_address,
        }
    }

    /// The URL of its S3 endpoint (started with `--s3-listen`).
    pub fn s3_endpoint(&self) -> String {
        format!(
            "http://{}",
            self.s3_address
                .as_deref()
                .expect("the server says where S3 listens")
        )
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(&self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream
    }

    /// A connection that said HELLO.
    pub fn greeted(&self) -> TcpStream {
        let mut stream = self.connect();
        hello(&mut stream);
        stream
    }

    /// A blocking client that does not retry, so that each call sees the server's own answer.
    pub fn client(&self) -> hydrant_client::Client {
        let config = hydrant_client::ClientConfig::new(std::slice::from_ref(&self.address))
            .connect_timeout(Duration::from_secs(60))
            .request_timeout(Duration::from_secs(60))
            .retries_max(0);
        hydrant_client::Client::with_config(config).unwrap()
    }

    /// A gauge or counter summed over the server's metrics (STATS).
    pub fn metric(&self, name: &str) -> u64 {
        let (_, text) = self.client().stats().unwrap().remove(0);
        text.lines()
            .filter(|line| line.split([' ', '{']).next() == Some(name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// The server's resident memory now.
    pub fn resident_bytes(&self) -> u64 {
        resident_bytes(self.child.id())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and wait until the process is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// VmRSS of a process, in bytes.
pub fn resident_bytes(pid: u32) -> u64 {
    status_field(pid, "VmRSS:") * 1024
}

/// The threads of a process.
pub fn thread_count(pid: u32) -> u64 {
    status_field(pid, "Threads:")
}

/// The number after `field` in /proc/PID/status.
fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/PID/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

pub fn frame(opcode: Opcode, request_id: u64, extension: &[u8], payload: &[u8]) -> Vec<u8> {
    frame_of_stream(opcode, request_id, extension, payload, false)
}

/// A frame that `more` flags as followed by others of the same request (a streamed request).
pub fn frame_of_stream(
    opcode: Opcode,
    request_id: u64,
    extension: &[u8],
    payload: &[u8],
    more: bool,
) -> Vec<u8> {
    let crc = if payload.is_empty() {
        0
    } else {
        crc32c::crc32c(payload)
    };
    let mut header = FrameHeader::new(opcode, request_id, extension, payload.len() as u64, crc);
    if more {
        header.flags = header.flags.with(hydrant_proto::FrameFlags::MORE);
    }
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(extension);
    frame.extend_from_slice(payload);
    frame
}

pub fn send(
    stream: &mut TcpStream,
    opcode: Opcode,
    request_id: u64,
    extension: &[u8],
    payload: &[u8],
) {
    stream
        .write_all(&frame(opcode, request_id, extension, payload))
        .unwrap();
}

pub struct Response {
    pub header: FrameHeader,
    pub extension: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Response {
    pub fn status(&self) -> Status {
        Status::from_byte(self.header.status).unwrap()
    }

    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
}

pub fn receive(stream: &mut TcpStream) -> Response {
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header_bytes).unwrap();
    let limits = Limits {
        payload_bytes_max: 1 << 30,
        ..Limits::default()
    };
    let header = FrameHeader::decode(&header_bytes, &limits).expect("a valid response header");
    let mut extension = vec![0; header.extension_len as usize];
    stream.read_exact(&mut extension).unwrap();
    header.check_extension(&extension).unwrap();
    let mut payload = vec![0; header.payload_len as usize];
    stream.read_exact(&mut payload).unwrap();
    let crc = if payload.is_empty() {
        0
    } else {
        crc32c::crc32c(&payload)
    };
    header.check_payload_crc(crc).unwrap();
    Response {
        header,
        extension,
        payload,
    }
}

/// One request and its answer on a greeted connection.
pub fn call(stream: &mut TcpStream, opcode: Opcode, extension: &[u8], payload: &[u8]) -> Response {
    send(stream, opcode, 7, extension, payload);
    let response = receive(stream);
    assert_eq!(response.header.request_id, 7);
    response
}

pub fn hello(stream: &mut TcpStream) -> HelloResponse {
    let request = HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: Limits::default(),
        client_nonce: [1; 16],
        proof: None,
    };
    send(stream, Opcode::Hello, 1, &request.encode(), &[]);
    let response = receive(stream);
    assert_eq!(response.status(), Status::Ok);
    HelloResponse::decode(&response.extension).unwrap()
}

/// Deterministic bytes that differ per seed and per offset.
pub fn object_bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut data = Vec::with_capacity(length + 8);
    while data.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(length);
    data
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait until `condition` holds (at most 60 s).
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The byte at `offset` of object `seed`'s generated contents: objects of any size are made and
/// checked as they stream, never stored on the test's side.
pub fn generated_word(seed: u64, word: u64) -> u64 {
    // splitmix64 of (seed, word index): cheap, and every 8-byte word differs.
    let mut z = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(word.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fill `buffer` with object `seed`'s bytes from `offset`.
pub fn generate(seed: u64, offset: u64, buffer: &mut [u8]) {
    for (index, byte) in buffer.iter_mut().enumerate() {
        let position = offset + index as u64;
        *byte = generated_word(seed, position / 8).to_le_bytes()[(position % 8) as usize];
    }
}

/// A reader of `len` generated bytes of object `seed` from `offset` (a PUT's source).
pub struct Generated {
    pub seed: u64,
    pub offset: u64,
    pub end: u64,
    /// Bytes handed out so far; the reader fails once it reaches `fail_at`, if set.
    pub fail_at: Option<u64>,
}

impl Generated {
    pub fn new(seed: u64, len: u64) -> Generated {
        Generated {
            seed,
            offset: 0,
            end: len,
            fail_at: None,
        }
    }
}

impl Read for Generated {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.fail_at.is_some_and(|at| self.offset >= at) {
            return Err(std::io::Error::other("the source fails here, as asked"));
        }
        let mut count = buffer.len().min((self.end - self.offset) as usize);
        if let Some(at) = self.fail_at {
            count = count.min((at - self.offset) as usize);
        }
        // Whole words at a time where aligned (the byte loop is the slow part).
        let mut written = 0;
        while written < count {
            let position = self.offset + written as u64;
            if position.is_multiple_of(8) && count - written >= 8 {
                let word = generated_word(self.seed, position / 8).to_le_bytes();
                buffer[written..written + 8].copy_from_slice(&word);
                written += 8;
            } else {
                generate(self.seed, position, &mut buffer[written..written + 1]);
                written += 1;
            }
        }
        self.offset += count as u64;
        Ok(count)
    }
}

/// A writer that checks what it is given against object `seed`'s bytes from `offset` (a GET's
/// destination), and keeps their CRC32C.
pub struct Checked {
    pub seed: u64,
    pub offset: u64,
    pub crc: u32,
    pub mismatch: Option<u64>,
}

impl Checked {
    pub fn new(seed: u64, offset: u64) -> Checked {
        Checked {
            seed,
            offset,
            crc: 0,
            mismatch: None,
        }
    }
}

impl Write for Checked {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut expected = vec![0u8; bytes.len()];
        let mut source = Generated {
            seed: self.seed,
            offset: self.offset,
            end: self.offset + bytes.len() as u64,
            fail_at: None,
        };
        source.read_exact(&mut expected)?;
        if self.mismatch.is_none() && expected != bytes {
            let at = expected
                .iter()
                .zip(bytes)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            self.mismatch = Some(self.offset + at as u64);
        }
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.offset += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The CRC32C of object `seed`'s first `len` bytes.
pub fn generated_crc(seed: u64, len: u64) -> u32 {
    let mut source = Generated::new(seed, len);
    let mut buffer = vec![0u8; 1 << 20];
    let mut crc = 0;
    loop {
        let count = source.read(&mut buffer).unwrap();
        if count == 0 {
            return crc;
        }
        crc = crc32c::crc32c_append(crc, &buffer[..count]);
    }
}

/// The server's largest RSS while `work` runs, sampled every 20 ms (the process may be gone
/// when a test fails: then the samples end).
pub fn rss_peak_during<T>(server: &ServerProcess, work: impl FnOnce() -> T) -> (T, u64) {
    peak_during(server, resident_bytes, work)
}

/// The largest value `measure` (of the server's pid) took while `work` ran, sampled every 20 ms.
pub fn peak_during<T>(
    server: &ServerProcess,
    measure: fn(u32) -> u64,
    work: impl FnOnce() -> T,
) -> (T, u64) {
    let pid = server.child.id();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let sample = || {
                if std::fs::metadata(format!("/proc/{pid}")).is_ok() {
                    measure(pid)
                } else {
                    0
                }
            };
            let mut highest = sample();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                highest = highest.max(sample());
                std::thread::sleep(Duration::from_millis(20));
            }
            highest.max(sample())
        })
    };
    let result = work();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    (result, sampler.join().unwrap())
}

/// The server's largest RSS growth over `baseline` (its RSS at some earlier point) while
/// `work` runs; printed, so that a run shows the figure.
pub fn rss_growth_during<T>(
    server: &ServerProcess,
    baseline: u64,
    work: impl FnOnce() -> T,
) -> (T, u64) {
    let (result, peak) = rss_peak_during(server, work);
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "server resident memory: {} MiB at the baseline, at most {} MiB more",
        baseline >> 20,
        growth >> 20
    );
    (result, growth)
}

/// Bytes free for an unprivileged writer on the file system of `path`.
pub fn free_bytes(path: &Path) -> u64 {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs writes one struct we own; the path is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(result, 0, "statvfs {}", path.display());
    stat.f_bavail as u64 * stat.f_frsize as u64
}

/// Bytes free on `path`'s file system once space freed a moment ago has come back: sampled
/// until two readings 200 ms apart differ by less than 64 MiB (at most 10 s).
pub fn settled_free_bytes(path: &Path) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = free_bytes(path);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = free_bytes(path);
        if now.abs_diff(last) < 64 << 20 || std::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Wait until `path`'s file system has `bytes` free: a killed server's data file is freed only
/// once the kernel has torn its ring down, a moment after the process is gone. Fails clearly
/// when the disk is too small.
pub fn wait_for_free_bytes(path: &Path, bytes: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while free_bytes(path) < bytes {
        assert!(
            std::time::Instant::now() < deadline,
            "this test needs {} GiB free under {}, and {} GiB are",
            bytes >> 30,
            path.display(),
            free_bytes(path) >> 30
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `data` as an unsigned `aws-chunked` body: `piece` bytes a chunk, then the trailer
/// `x-amz-checksum-crc32c` with `checksum`.
pub fn aws_chunked(data: &[u8], piece: usize, checksum: &str) -> Vec<u8> {
    let mut framed = Vec::new();
    for part in data.chunks(piece) {
        framed.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        framed.extend_from_slice(part);
        framed.extend_from_slice(b"\r\n");
    }
    framed.extend_from_slice(format!("0\r\nx-amz-checksum-crc32c:{checksum}\r\n\r\n").as_bytes());
    framed
}

pub fn crc32c_base64(data: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(crc32c::crc32c(data).to_be_bytes())
}
