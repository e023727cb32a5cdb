//! Malformed and hostile HTTP at the S3 endpoint of a real `hydrant-server`, sent as raw bytes
//! over plain TCP: every case gets an S3 error or a clean close (never silence, never an object
//! stored with bytes it was not sent), and after every case a normal PUT and GET on fresh
//! connections still work.

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{aws_chunked, crc32c_base64, object_bytes, Scratch, ServerProcess};
use hydrant_proto::message::Message;

/// The bucket the tests write to (every valid name is a bucket of the default origin).
const BUCKET: &str = "hostile";
/// How long a test waits for an answer or a close before it calls the server hung.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a response head we read at most (the server's answers are far smaller).
const RESPONSE_HEAD_BYTES_MAX: usize = 64 << 10;
/// The endpoint's bounds, as server/src/s3/mod.rs and docs/s3.md state them.
const S3_CONNECTIONS_MAX: usize = 4096;
const S3_HEADER_BYTES_MAX: usize = 64 << 10;
const S3_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The engine's chunk (its default): a PUT larger than this is streamed a chunk at a time.
const CHUNK_BYTES: usize = 4 << 20;
/// The key of the server started with `--s3-credentials`.
const ACCESS_KEY: &str = "hostile-tester";
const SECRET_KEY: &str = "a secret of sixteen bytes or more";

/// A server with an S3 endpoint, and the address that endpoint listens on.
fn start(scratch: &Scratch, extra: &[&str]) -> (ServerProcess, String) {
    let mut arguments = vec!["--s3-listen", "127.0.0.1:0"];
    arguments.extend_from_slice(extra);
    let server = ServerProcess::start(scratch.path(), 512, &arguments, &[]);
    let address = server
        .s3_address
        .clone()
        .expect("the server says where S3 listens");
    (server, address)
}

/// A response as it came over the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (found, value) = line.split_once(':')?;
            found.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }

    /// The S3 error code of an XML error body.
    fn error_code(&self) -> Option<String> {
        let text = self.text();
        let start = text.find("<Code>")? + "<Code>".len();
        let end = start + text[start..].find("</Code>")?;
        Some(text[start..end].to_string())
    }
}

/// What the server did with a request: answered it, or closed the connection unanswered.
#[derive(Debug)]
enum Outcome {
    Answered(Answer),
    Closed(String),
}

impl Outcome {
    fn summary(&self) -> String {
        match self {
            Outcome::Answered(answer) => format!(
                "answered {} {}",
                answer.status,
                answer.error_code().unwrap_or_default()
            ),
            Outcome::Closed(how) => format!("closed ({how})"),
        }
    }
}

fn connect(address: &str) -> TcpStream {
    let stream = TcpStream::connect(address)
        .unwrap_or_else(|error| panic!("connect to {address}: {error} (is the server gone?)"));
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    stream
}

/// Write `bytes` as far as the server takes them: a server that refuses a request may close
/// before it has read it all, which makes the write fail; what it answered is read next.
fn send(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.write_all(bytes);
}

/// The next response on `reader`, or the close that came instead; a server that does neither
/// within the stream's read timeout (`ANSWER_TIMEOUT` unless a test sets another) fails the
/// test.
fn read_outcome(reader: &mut BufReader<TcpStream>) -> Outcome {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        match reader.read_until(b'\n', &mut head) {
            Ok(0) if head.is_empty() => return Outcome::Closed("end of stream".into()),
            Ok(0) => panic!(
                "the connection ended inside a response head: {:?}",
                lossy(&head)
            ),
            Ok(_) => {}
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!(
                    "neither an answer nor a close within {:?}: the server hangs (read so far: {:?})",
                    reader.get_ref().read_timeout().unwrap().unwrap_or_default(),
                    lossy(&head)
                )
            }
            Err(error) if head.is_empty() => return Outcome::Closed(error.to_string()),
            Err(error) => panic!("{error} inside a response head: {:?}", lossy(&head)),
        }
        assert!(
            head.len() <= RESPONSE_HEAD_BYTES_MAX,
            "a response head past 64 KiB"
        );
    }
    let head = String::from_utf8(head).expect("a response head in ASCII");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head:?}"));
    let mut answer = Answer {
        status,
        head,
        body: Vec::new(),
    };
    answer.body = if let Some(length) = answer.header("content-length") {
        let mut body = vec![0; length.parse().expect("a numeric Content-Length")];
        reader
            .read_exact(&mut body)
            .expect("the body Content-Length announced");
        body
    } else if answer
        .header("transfer-encoding")
        .is_some_and(|value| value.contains("chunked"))
    {
        read_chunked(reader)
    } else if status < 200 || status == 204 || status == 304 {
        Vec::new()
    } else {
        let mut body = Vec::new();
        reader
            .read_to_end(&mut body)
            .expect("a body that ends at the close");
        body
    };
    Outcome::Answered(answer)
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a chunk's size line");
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16).unwrap_or_else(|_| panic!("{line:?}"));
        if size == 0 {
            while line != "\r\n" && !line.is_empty() {
                line.clear();
                reader.read_line(&mut line).expect("a trailer line");
            }
            return body;
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).expect("a chunk");
        line.clear();
        reader.read_line(&mut line).expect("a chunk's end");
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned()
}

/// `request` on a fresh connection: what came of it.
fn exchange(address: &str, request: &[u8]) -> Outcome {
    let mut stream = connect(address);
    send(&mut stream, request);
    read_outcome(&mut BufReader::new(stream))
}

fn answered(outcome: Outcome, what: &str) -> Answer {
    match outcome {
        Outcome::Answered(answer) => answer,
        Outcome::Closed(how) => panic!("{what}: the connection was closed unanswered ({how})"),
    }
}

fn put_request(key: &str, data: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        data.len()
    )
    .into_bytes();
    request.extend_from_slice(data);
    request
}

fn put(address: &str, key: &str, data: &[u8]) -> Answer {
    answered(exchange(address, &put_request(key, data)), "PUT")
}

fn get(address: &str, key: &str) -> Answer {
    let request = format!("GET /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\nConnection: close\r\n\r\n");
    answered(exchange(address, request.as_bytes()), "GET")
}

/// The object `key` holds exactly `data`.
fn assert_holds(address: &str, key: &str, data: &[u8], after: &str) {
    let answer = get(address, key);
    assert_eq!(
        answer.status,
        200,
        "after {after}: GET {key}: {}",
        answer.text()
    );
    assert_eq!(
        answer.body.len(),
        data.len(),
        "after {after}: {key} holds {} bytes, not the {} it was given",
        answer.body.len(),
        data.len()
    );
    assert!(
        answer.body == data,
        "after {after}: {key} holds other bytes"
    );
}

/// No object `key`: NoSuchKey.
fn assert_absent(address: &str, key: &str, after: &str) {
    let answer = get(address, key);
    assert_eq!(
        (answer.status, answer.error_code().as_deref()),
        (404, Some("NoSuchKey")),
        "after {after}: GET {key} finds nothing; got {} bytes: {}",
        answer.body.len(),
        lossy(&answer.body)
    );
}

/// A normal PUT and a GET of what it stored, each on a fresh connection.
fn assert_serves(address: &str, after: &str) {
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let probe = PROBES.fetch_add(1, Ordering::Relaxed);
    let key = format!("probe-{probe}");
    let data = object_bytes(probe, 1000 + probe as usize);
    let answer = put(address, &key, &data);
    assert_eq!(
        answer.status,
        200,
        "after {after}: PUT {key}: {}",
        answer.text()
    );
    assert_holds(address, &key, &data, after);
}

/// Refused: an error answer (one of `statuses` when any are named) or a close; never a
/// success.
fn assert_refused(outcome: &Outcome, statuses: &[u16], what: &str) {
    if let Outcome::Answered(answer) = outcome {
        assert!(
            answer.status >= 400 && (statuses.is_empty() || statuses.contains(&answer.status)),
            "{what}: answered {} (wanted an error{}): {}",
            answer.status,
            if statuses.is_empty() {
                String::new()
            } else {
                format!(" of {statuses:?}")
            },
            answer.text()
        );
    }
    eprintln!("{what}: {}", outcome.summary());
}

/// Send `head` and the first `sent` bytes of `body`, then close the write side: the server
/// reads the end of the stream where the rest of the body should be. What it did then.
fn cut_after(address: &str, head: &str, body: &[u8], sent: usize) -> Outcome {
    let mut stream = connect(address);
    send(&mut stream, head.as_bytes());
    send(&mut stream, &body[..sent]);
    let _ = stream.shutdown(Shutdown::Write);
    read_outcome(&mut BufReader::new(stream))
}

#[test]
fn headers_beyond_64_kib_get_431_or_a_close_and_the_server_serves_on() {
    let scratch = Scratch::new("s3-hostile-headers");
    let (_server, address) = start(&scratch, &[]);
    // Within the bound the request is served: a GET of a missing key answers NoSuchKey.
    let padding = "p".repeat(S3_HEADER_BYTES_MAX / 2);
    let within = format!(
        "GET /{BUCKET}/missing HTTP/1.1\r\nHost: s3\r\nX-Padding: {padding}\r\nConnection: close\r\n\r\n"
    );
    let answer = answered(exchange(&address, within.as_bytes()), "32 KiB of headers");
    assert_eq!(
        answer.error_code().as_deref(),
        Some("NoSuchKey"),
        "{answer:?}"
    );

    let one_huge = format!(
        "GET /{BUCKET}/missing HTTP/1.1\r\nHost: s3\r\nX-Padding: {}\r\n\r\n",
        "p".repeat(4 * S3_HEADER_BYTES_MAX)
    );
    let many: String = (0..1024)
        .map(|index| format!("X-Padding-{index}: {}\r\n", "p".repeat(1000)))
        .collect();
    let many = format!("GET /{BUCKET}/missing HTTP/1.1\r\nHost: s3\r\n{many}\r\n");
    let mut put_huge = format!(
        "PUT /{BUCKET}/huge-headers HTTP/1.1\r\nHost: s3\r\nContent-Length: 5\r\nX-Amz-Meta-Padding: {}\r\n\r\n",
        "p".repeat(2 * S3_HEADER_BYTES_MAX)
    );
    put_huge.push_str("hello");
    for (what, request) in [
        ("one header of 256 KiB", one_huge),
        ("1,024 headers of 1 KiB", many),
        ("a PUT with a 128 KiB header", put_huge),
    ] {
        let outcome = exchange(&address, request.as_bytes());
        assert_refused(&outcome, &[431], what);
        assert_serves(&address, what);
    }
    assert_absent(&address, "huge-headers", "a PUT with a 128 KiB header");
}

#[test]
fn a_request_head_sent_a_byte_a_second_is_closed_at_the_header_timeout() {
    let scratch = Scratch::new("s3-hostile-slow-head");
    let (_server, address) = start(&scratch, &[]);
    let mut stream = connect(&address);
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let started = Instant::now();
    send(
        &mut stream,
        b"GET /hostile/slow HTTP/1.1\r\nHost: s3\r\nX-Slow: ",
    );
    let closed_after = loop {
        let elapsed = started.elapsed();
        assert!(
            elapsed < S3_HEADER_TIMEOUT + Duration::from_secs(10),
            "a head still unfinished after {elapsed:?} is still served: the header timeout does not hold"
        );
        if stream.write_all(b"s").is_err() {
            break elapsed;
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Ok(0) | Err(_) => break elapsed,
            Ok(_) => {
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest);
                let answer = [&byte[..], &rest].concat();
                assert!(
                    answer.starts_with(b"HTTP/1.1 4"),
                    "an unfinished head gets an error or a close: {:?}",
                    lossy(&answer)
                );
                break elapsed;
            }
        }
    };
    eprintln!("a head trickled a byte a second: closed after {closed_after:?}");
    assert!(
        closed_after + Duration::from_secs(2) >= S3_HEADER_TIMEOUT,
        "closed after {closed_after:?}, before the {S3_HEADER_TIMEOUT:?} a client has for its head"
    );
    assert_serves(&address, "a head trickled a byte a second");
}

/// `YYYYMMDD` and `YYYYMMDDTHHMMSSZ` of now, in UTC (SigV4's date and x-amz-date).
fn amz_now() -> (String, String) {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (days, time) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // The civil date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    let (hour, minute, second) = (time / 3600, time % 3600 / 60, time % 60);
    let stamp = format!("{date}T{hour:02}{minute:02}{second:02}Z");
    (date, stamp)
}

/// A request with a well-formed SigV4 Authorization header for `access_key` whose signature is
/// wrong (all zeros), dated now.
fn forged(address: &str, access_key: &str, method: &str, key: &str, body: &[u8]) -> Vec<u8> {
    let (date, stamp) = amz_now();
    let mut request = format!(
        "{method} /{BUCKET}/{key} HTTP/1.1\r\nHost: {address}\r\nx-amz-date: {stamp}\r\n\
         x-amz-content-sha256: UNSIGNED-PAYLOAD\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential={access_key}/{date}/us-east-1/s3/aws4_request, \
         SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        "0".repeat(64),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// A client that signs with the server's key (object_store's SigV4), to show the key works.
fn signed_store(address: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(format!("http://{address}"))
        .with_allow_http(true)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .build()
        .unwrap()
}

fn block_on<F: std::future::Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(work)
}

fn signed_put(address: &str, key: &str, data: &[u8]) {
    use object_store::ObjectStoreExt;
    let store = signed_store(address);
    let payload = object_store::PutPayload::from(data.to_vec());
    block_on(store.put(&key.into(), payload)).expect("a signed PUT");
}

/// The object `key` read with a signed GET; `None` when there is none.
fn signed_get(address: &str, key: &str) -> Option<Vec<u8>> {
    use object_store::ObjectStoreExt;
    let store = signed_store(address);
    block_on(async {
        match store.get(&key.into()).await {
            Ok(found) => Some(found.bytes().await.expect("a signed GET's body").to_vec()),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(error) => panic!("a signed GET of {key}: {error}"),
        }
    })
}

#[test]
fn a_wrong_signature_or_none_gets_403_and_stores_nothing() {
    let scratch = Scratch::new("s3-hostile-signatures");
    let credentials = scratch.path().join("credentials.toml");
    std::fs::write(
        &credentials,
        format!(
            "[[key]]\naccess_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET_KEY}\"\n\
             read = [\"*\"]\nwrite = [\"*\"]\n"
        ),
    )
    .unwrap();
    let credentials = credentials.to_str().unwrap();
    let (_server, address) = start(&scratch, &["--s3-credentials", credentials]);
    // The key works: what it signs is served.
    signed_put(&address, "signed", b"signed bytes");
    assert_eq!(
        signed_get(&address, "signed").as_deref(),
        Some(&b"signed bytes"[..])
    );

    let unsigned = put_request("unsigned", b"unsigned body");
    let cases = [
        (
            "a PUT with a wrong signature",
            forged(&address, ACCESS_KEY, "PUT", "forged", b"forged body"),
            "SignatureDoesNotMatch",
        ),
        (
            "a GET with a wrong signature",
            forged(&address, ACCESS_KEY, "GET", "signed", b""),
            "SignatureDoesNotMatch",
        ),
        (
            "a PUT signed by an unknown key",
            forged(&address, "nobody", "PUT", "stranger", b"stranger body"),
            "InvalidAccessKeyId",
        ),
        ("an unsigned PUT", unsigned, "AccessDenied"),
    ];
    for (what, request, code) in cases {
        let answer = answered(exchange(&address, &request), what);
        assert_eq!(
            (answer.status, answer.error_code().as_deref()),
            (403, Some(code)),
            "{what}: {}",
            answer.text()
        );
        eprintln!("{what}: 403 {code}");
    }
    let garbled = format!(
        "GET /{BUCKET}/signed HTTP/1.1\r\nHost: {address}\r\n\
         Authorization: AWS4-HMAC-SHA256 this is not a credential\r\nConnection: close\r\n\r\n"
    );
    let outcome = exchange(&address, garbled.as_bytes());
    assert_refused(&outcome, &[400, 403], "a garbled Authorization header");
    if let Outcome::Answered(answer) = &outcome {
        assert!(
            !answer.text().contains("signed bytes"),
            "a garbled Authorization header read the object"
        );
    }

    for key in ["forged", "stranger", "unsigned"] {
        assert_eq!(signed_get(&address, key), None, "{key} was not stored");
    }
    assert_eq!(
        signed_get(&address, "signed").as_deref(),
        Some(&b"signed bytes"[..]),
        "the signed object is untouched"
    );
    signed_put(&address, "signed-after", b"still served");
    assert_eq!(
        signed_get(&address, "signed-after").as_deref(),
        Some(&b"still served"[..])
    );
}

/// `data` in HTTP/1.1 chunked framing, `piece` bytes a chunk, with its last chunk.
fn chunked(data: &[u8], piece: usize) -> Vec<u8> {
    let mut framed = Vec::new();
    for part in data.chunks(piece) {
        framed.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        framed.extend_from_slice(part);
        framed.extend_from_slice(b"\r\n");
    }
    framed.extend_from_slice(b"0\r\n\r\n");
    framed
}

fn chunked_head(key: &str, decoded_bytes: usize) -> String {
    format!(
        "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\nTransfer-Encoding: chunked\r\n\
         x-amz-decoded-content-length: {decoded_bytes}\r\nConnection: close\r\n\r\n"
    )
}

#[test]
fn a_chunked_put_cut_mid_body_stores_nothing_and_the_server_serves_on() {
    let scratch = Scratch::new("s3-hostile-chunked");
    let (_server, address) = start(&scratch, &[]);
    // A whole chunked body that says its decoded length is stored.
    let data = object_bytes(30, 100_000);
    let framed = chunked(&data, 8192);
    let whole = [chunked_head("whole", data.len()).as_bytes(), &framed].concat();
    assert_eq!(
        answered(exchange(&address, &whole), "a whole chunked PUT").status,
        200
    );
    assert_holds(&address, "whole", &data, "a whole chunked PUT");
    let old = object_bytes(31, 5000);
    assert_eq!(put(&address, "overwritten", &old).status, 200);

    let large = object_bytes(32, 2 * CHUNK_BYTES + 4321);
    let large_framed = chunked(&large, 64 << 10);
    // (what, key, the body and its framing, bytes of the framing sent before the cut)
    let small = (&data[..], &framed[..]);
    let large = (&large[..], &large_framed[..]);
    let cases = [
        ("cut inside a chunk", "cut-small", small, 40_000),
        (
            "cut inside a size line",
            "cut-size-line",
            small,
            8192 + 8 + 1,
        ),
        (
            "cut before the last chunk",
            "cut-last",
            small,
            framed.len() - 5,
        ),
        (
            "cut in a large body's second chunk",
            "cut-large",
            large,
            CHUNK_BYTES + 70_000,
        ),
        ("cut while overwriting", "overwritten", small, 60_000),
    ];
    for (what, key, (data, framed), sent) in cases {
        let outcome = cut_after(&address, &chunked_head(key, data.len()), framed, sent);
        assert_refused(&outcome, &[], what);
        if key == "overwritten" {
            assert_holds(&address, key, &old, what);
        } else {
            assert_absent(&address, key, what);
        }
        assert_serves(&address, what);
    }

    // Cut without a goodbye: the connection is dropped mid-body.
    let mut stream = connect(&address);
    send(&mut stream, chunked_head("dropped", data.len()).as_bytes());
    send(&mut stream, &framed[..30_000]);
    drop(stream);
    std::thread::sleep(Duration::from_millis(500));
    assert_absent(&address, "dropped", "a chunked PUT dropped mid-body");
    assert_serves(&address, "a chunked PUT dropped mid-body");

    // aws-chunked, anonymous, cut.
    let head = format!(
        "PUT /{BUCKET}/aws-chunked HTTP/1.1\r\nHost: s3\r\nContent-Encoding: aws-chunked\r\n\
         x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER\r\nx-amz-trailer: x-amz-checksum-crc32\r\n\
         x-amz-decoded-content-length: {}\r\nContent-Length: {}\r\n\r\n",
        data.len(),
        framed.len() + 40
    );
    let outcome = cut_after(&address, &head, &framed, 50_000);
    assert_refused(&outcome, &[], "an anonymous aws-chunked PUT, cut");
    assert_absent(&address, "aws-chunked", "an anonymous aws-chunked PUT, cut");
    // aws-chunked framing without the header that says so: never stored with its framing.
    let head = format!(
        "PUT /{BUCKET}/framed HTTP/1.1\r\nHost: s3\r\nContent-Encoding: aws-chunked\r\n\
         x-amz-decoded-content-length: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        data.len(),
        framed.len()
    );
    let outcome = exchange(&address, &[head.as_bytes(), &framed].concat());
    match &outcome {
        Outcome::Answered(answer) if answer.status == 200 => {
            assert_holds(&address, "framed", &data, "aws-chunked framing, undeclared")
        }
        _ => {
            assert_refused(&outcome, &[], "aws-chunked framing, undeclared");
            assert_absent(&address, "framed", "aws-chunked framing, undeclared");
        }
    }
    assert_serves(&address, "aws-chunked PUTs");
}

#[test]
fn a_content_length_beyond_the_body_sent_stores_nothing() {
    let scratch = Scratch::new("s3-hostile-long-length");
    let (_server, address) = start(&scratch, &[]);
    let old = object_bytes(40, 3000);
    assert_eq!(put(&address, "overwritten", &old).status, 200);
    let small = object_bytes(41, 100_000);
    let large = object_bytes(42, 2 * CHUNK_BYTES + 1000);
    let cases: [(&str, &str, &[u8], usize); 4] = [
        (
            "a PUT that sends 40% of its Content-Length",
            "short",
            &small,
            40_000,
        ),
        ("a PUT that sends none of its body", "empty", &small, 0),
        (
            "a large PUT that sends half its Content-Length",
            "short-large",
            &large,
            CHUNK_BYTES + 1000,
        ),
        (
            "an overwrite that sends 10% of its Content-Length",
            "overwritten",
            &small,
            10_000,
        ),
    ];
    for (what, key, data, sent) in cases {
        let head = format!(
            "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\nContent-Length: {}\r\n\r\n",
            data.len()
        );
        let outcome = cut_after(&address, &head, data, sent);
        assert_refused(&outcome, &[], what);
        if key == "overwritten" {
            assert_holds(&address, key, &old, what);
        } else {
            assert_absent(&address, key, what);
        }
        assert_serves(&address, what);
    }
}

/// `first` then `then` on one keep-alive connection, written at once: the outcomes of the two
/// requests the server reads in them. With `end`, the write side is closed once the first is
/// answered, so that an unfinished second head meets the end of the stream (the server drops
/// a request whose client closed its side, so only then).
fn pipelined(address: &str, first: &[u8], then: &[u8], end: bool) -> (Outcome, Outcome) {
    let mut stream = connect(address);
    send(&mut stream, &[first, then].concat());
    let mut reader = BufReader::new(stream);
    let first = read_outcome(&mut reader);
    if end {
        let _ = reader.get_ref().shutdown(Shutdown::Write);
    }
    let second = read_outcome(&mut reader);
    (first, second)
}

#[test]
fn bytes_beyond_a_short_content_length_are_never_stored() {
    let scratch = Scratch::new("s3-hostile-short-length");
    let (_server, address) = start(&scratch, &[]);
    let declared = b"0123456789";
    let head = |key: &str| {
        format!("PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\nContent-Length: 10\r\n\r\n")
            .into_bytes()
    };

    // Garbage after the declared bytes: the object holds the declared bytes; the garbage is
    // read as the next request's head, and refused.
    let first = [head("short"), declared.to_vec()].concat();
    let garbage = b"\x00\x01\x02 these bytes are no request \xff\xfe\r\n\r\n";
    let (stored, next) = pipelined(&address, &first, garbage, false);
    assert_eq!(answered(stored, "a PUT followed by garbage").status, 200);
    assert_refused(&next, &[400], "garbage after a body");
    assert_holds(&address, "short", declared, "a PUT followed by garbage");
    // Ten bytes more than Content-Length said: the object holds the declared ten; the stray
    // ten wait as an unfinished head until the write side closes, and are dropped then.
    let first = [head("longer"), declared.to_vec()].concat();
    let (stored, next) = pipelined(&address, &first, b"abcdefghij", true);
    assert_eq!(answered(stored, "a PUT with 10 bytes too many").status, 200);
    assert_refused(&next, &[400], "10 stray bytes after a body");
    assert_holds(&address, "longer", declared, "a PUT with 10 bytes too many");
    assert_serves(&address, "stray bytes after a body");

    // A whole request after the declared bytes is the next request (HTTP/1.1 pipelining): the
    // server frames both by their Content-Length, as the client did.
    let first = [head("framed"), declared.to_vec()].concat();
    let then = put_request("next", b"abc");
    let (stored, next) = pipelined(&address, &first, &then, false);
    assert_eq!(
        answered(stored, "the first of two pipelined PUTs").status,
        200
    );
    assert_eq!(
        answered(next, "the second of two pipelined PUTs").status,
        200
    );
    assert_holds(&address, "framed", declared, "two pipelined PUTs");
    assert_holds(&address, "next", b"abc", "two pipelined PUTs");

    // Content-Length and Transfer-Encoding both: the chunked framing wins (RFC 9112 6.3), and
    // the connection is closed after the answer, so that no byte is read under the other one.
    let request = format!(
        "PUT /{BUCKET}/both HTTP/1.1\r\nHost: s3\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\
         x-amz-decoded-content-length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    );
    let smuggled = put_request("smuggled", b"smuggled");
    let (stored, next) = pipelined(&address, request.as_bytes(), &smuggled, false);
    let stored = answered(stored, "a PUT with Content-Length and Transfer-Encoding");
    assert_eq!(stored.status, 200, "{}", stored.text());
    assert!(
        matches!(next, Outcome::Closed(_)),
        "after a request with both framings, the connection closes: {}",
        next.summary()
    );
    assert_holds(
        &address,
        "both",
        b"hello",
        "Content-Length and Transfer-Encoding",
    );
    assert_absent(&address, "smuggled", "Content-Length and Transfer-Encoding");

    // Content-Lengths that cannot be believed.
    for (what, lengths) in [
        (
            "two different Content-Lengths",
            "Content-Length: 3\r\nContent-Length: 10\r\n",
        ),
        ("a negative Content-Length", "Content-Length: -10\r\n"),
        (
            "a Content-Length that is no number",
            "Content-Length: ten\r\n",
        ),
        (
            "a Content-Length past 2^64",
            "Content-Length: 99999999999999999999999\r\n",
        ),
        (
            "a decoded length short of the body",
            "Content-Length: 10\r\nx-amz-decoded-content-length: 4\r\n",
        ),
        (
            "a decoded length beyond the body",
            "Content-Length: 10\r\nx-amz-decoded-content-length: 20\r\n",
        ),
    ] {
        let request =
            format!("PUT /{BUCKET}/unbelieved HTTP/1.1\r\nHost: s3\r\n{lengths}\r\n0123456789");
        let outcome = exchange(&address, request.as_bytes());
        assert_refused(&outcome, &[400], what);
        assert_absent(&address, "unbelieved", what);
        assert_serves(&address, what);
    }
}

/// Allow this process as many open files as the hard limit does; fail clearly when that is
/// fewer than `wanted`.
fn raise_open_files_limit(wanted: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct that we own.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads one struct that we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    assert!(
        limit.rlim_cur >= wanted,
        "this test needs {wanted} open files; the hard limit is {}",
        limit.rlim_max
    );
}

/// Connections waiting in the accept queue of the listening socket on 127.0.0.1:`port` (the
/// rx_queue of its line in /proc/net/tcp, where listening sockets come first).
fn accept_queue(port: u16) -> usize {
    let wanted = format!("0100007F:{port:04X}");
    let table = BufReader::new(std::fs::File::open("/proc/net/tcp").unwrap());
    for line in table.lines().skip(1) {
        let line = line.unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields[1] == wanted && fields[3] == "0A" {
            let waiting = fields[4].split(':').nth(1).unwrap();
            return usize::from_str_radix(waiting, 16).unwrap();
        }
    }
    panic!("no socket listens on 127.0.0.1:{port} in /proc/net/tcp")
}

/// `count` connections to `address`, made no faster than the server accepts them: a full
/// accept queue drops the next SYN, and the retry a second later would let the first
/// connections reach the idle timeout before the last are made (on a loaded machine).
fn connect_paced(address: &str, count: usize) -> Vec<TcpStream> {
    const BATCH: usize = 32;
    const QUEUED_MAX: usize = 64;
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    let mut streams = Vec::with_capacity(count);
    while streams.len() < count {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        while accept_queue(port) > QUEUED_MAX {
            assert!(Instant::now() < deadline, "the server stopped accepting");
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..BATCH.min(count - streams.len()) {
            let stream = TcpStream::connect(address).expect("connect");
            stream.set_nonblocking(true).unwrap();
            streams.push(stream);
        }
    }
    streams
}

/// Whether the server has closed `stream` (which is nonblocking).
fn closed_by_server(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => panic!("the server sent bytes on a connection that sent none"),
        Err(error) => error.kind() != ErrorKind::WouldBlock,
    }
}

#[test]
fn ten_thousand_idle_connections_are_held_to_the_bound_and_then_served() {
    const CONNECTIONS: usize = 10_000;
    const GROWTH_BYTES_MAX: u64 = 512 << 20;
    raise_open_files_limit(CONNECTIONS as u64 + 1000);
    let scratch = Scratch::new("s3-hostile-idle");
    let (server, address) = start(&scratch, &[]);
    assert_serves(&address, "the start");
    // The permits of those two connections are given back just after they close.
    std::thread::sleep(Duration::from_millis(300));
    let baseline = server.resident_bytes();

    let started = Instant::now();
    let (idle, growth) = common::rss_growth_during(&server, baseline, || {
        let idle = connect_paced(&address, CONNECTIONS);
        eprintln!("{CONNECTIONS} connected in {:?}", started.elapsed());
        // The server accepts them all: those past its bound it closes at once.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut closed = 0;
        while Instant::now() < deadline {
            closed = idle
                .iter()
                .filter(|stream| closed_by_server(stream))
                .count();
            if closed >= CONNECTIONS - S3_CONNECTIONS_MAX {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "{CONNECTIONS} connections in {:?}: {closed} closed by the server",
            started.elapsed()
        );
        assert_eq!(
            CONNECTIONS - closed,
            S3_CONNECTIONS_MAX,
            "the server holds {} of {CONNECTIONS} idle connections open",
            CONNECTIONS - closed
        );
        // One more, while the bound is reached: closed unanswered.
        let outcome = exchange(&address, &put_request("beyond", b"beyond"));
        assert!(
            matches!(outcome, Outcome::Closed(_)),
            "a connection past the bound is closed: {}",
            outcome.summary()
        );
        idle
    });
    eprintln!(
        "{} bytes resident per idle connection held",
        growth / S3_CONNECTIONS_MAX as u64
    );
    assert!(
        growth < GROWTH_BYTES_MAX,
        "{} MiB more resident with {S3_CONNECTIONS_MAX} idle connections",
        growth >> 20
    );
    // Within the idle timeout, so that it was the bound that closed them, not the timeout.
    assert!(
        started.elapsed() < S3_HEADER_TIMEOUT,
        "the flood took {:?}, past the idle timeout",
        started.elapsed()
    );

    drop(idle);
    // The server sees the closes and gives their permits back: a request is served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match exchange(&address, &put_request("after-idle", b"after")) {
            Outcome::Answered(answer) => {
                assert_eq!(answer.status, 200, "{}", answer.text());
                break;
            }
            Outcome::Closed(how) => assert!(
                Instant::now() < deadline,
                "10 s after the idle connections closed, requests are still refused ({how})"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_holds(&address, "after-idle", b"after", "10,000 idle connections");
    assert_absent(&address, "beyond", "10,000 idle connections");
    assert_serves(&address, "10,000 idle connections");
}

#[test]
fn bytes_that_are_not_http_get_an_error_or_a_close_and_the_server_serves_on() {
    let scratch = Scratch::new("s3-hostile-garbage");
    let (_server, address) = start(&scratch, &[]);
    let hello = hydrant_proto::message::HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: hydrant_proto::Limits::default(),
        client_nonce: [1; 16],
        proof: None,
    };
    let native_hello = common::frame(hydrant_proto::Opcode::Hello, 1, &hello.encode(), &[]);
    let mut tls_hello = vec![
        0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03,
    ];
    tls_hello.extend_from_slice(&object_bytes(60, 200));
    let long_line = format!(
        "GET /{BUCKET}/{} HTTP/1.1\r\nHost: s3\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let endless_line = format!("GET /{BUCKET}/{}", "a".repeat(256 << 10));
    let cases: [(&str, Vec<u8>); 10] = [
        ("4 KiB of random bytes", object_bytes(61, 4096)),
        ("a native-protocol HELLO", native_hello),
        ("a TLS ClientHello", tls_hello),
        (
            "the HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        ),
        ("an HTTP/0.9 request", b"GET /\r\n\r\n".to_vec()),
        (
            "an unknown HTTP version",
            b"GET /hostile/x HTTP/7.3\r\nHost: s3\r\n\r\n".to_vec(),
        ),
        (
            "a header line without a colon",
            b"GET /hostile/x HTTP/1.1\r\nno colon\r\n\r\n".to_vec(),
        ),
        (
            "a NUL in a header value",
            b"GET /hostile/x HTTP/1.1\r\nHost: s\x003\r\n\r\n".to_vec(),
        ),
        ("a request line of 1 MiB", long_line.into_bytes()),
        (
            "256 KiB of request line without an end",
            endless_line.into_bytes(),
        ),
    ];
    for (what, request) in cases {
        let outcome = exchange(&address, &request);
        assert_refused(&outcome, &[], what);
        assert_serves(&address, what);
    }
    // A request line within the head's bound but with a key past S3's 1,024 bytes: an S3
    // error, answered.
    let request = format!(
        "GET /{BUCKET}/{} HTTP/1.1\r\nHost: s3\r\nConnection: close\r\n\r\n",
        "k".repeat(S3_HEADER_BYTES_MAX - 4096)
    );
    let answer = answered(exchange(&address, request.as_bytes()), "a 60 KiB key");
    assert!(
        (400..500).contains(&answer.status) && answer.error_code().is_some(),
        "a 60 KiB key: {} {}",
        answer.status,
        answer.text()
    );
    eprintln!("a 60 KiB key: {} {:?}", answer.status, answer.error_code());
    assert_serves(&address, "a 60 KiB key");
}

/// A PUT that announces `announced` bytes, sends `sent` of them and then neither sends nor
/// closes.
fn stalled_put(address: &str, key: &str, announced: usize, sent: &[u8]) -> TcpStream {
    let mut stream = connect(address);
    let head =
        format!("PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\nContent-Length: {announced}\r\n\r\n");
    send(&mut stream, head.as_bytes());
    send(&mut stream, sent);
    stream
}

/// The header timeout bounds how long a client may take over its head; a body that stops
/// arriving should be bounded too (the native protocol closes a quiet connection after
/// `--idle-timeout`, mid-request or not). While it stalls it holds its connection, the dirty
/// budget it reserved (the size it announced) and, when streamed, a chunk of the streamed-bytes
/// bound: 16 stalled PUTs that announce 8 MiB hold the whole default dirty budget (128 MiB),
/// and every other write waits for room and is refused with SlowDown, for as long as they stay.
#[test]
fn a_put_whose_body_stalls_is_closed_by_a_timeout() {
    let scratch = Scratch::new("s3-hostile-stalled-body");
    let (_server, address) = start(&scratch, &[]);
    let bound = S3_HEADER_TIMEOUT + Duration::from_secs(10);
    let stream = stalled_put(&address, "stalled", 100_000, b"0123456789");
    stream.set_read_timeout(Some(bound)).unwrap();
    let started = Instant::now();
    let outcome = read_outcome(&mut BufReader::new(stream));
    eprintln!(
        "a stalled body: {} after {:?}",
        outcome.summary(),
        started.elapsed()
    );
    assert_refused(&outcome, &[], "a body that stalls");
    assert_absent(&address, "stalled", "a body that stalls");
    assert_serves(&address, "a body that stalls");
}

/// The server's resident memory once it has stopped growing for a second (at most 15 s).
fn settled_resident_bytes(server: &ServerProcess) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = server.resident_bytes();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = server.resident_bytes();
        if now <= last || Instant::now() > deadline {
            return now.max(last);
        }
        last = now;
    }
}

/// docs/s3.md: "a PUT's chunks in memory: within the node's `streamed_bytes_max`, shared with
/// the native protocol". A PUT of at most a chunk is gathered whole before it is stored; many
/// of them that stall one byte short hold their bytes in memory at once, and that memory too
/// must stay within the bound (the engine's default, 128 MiB), not grow with the connections
/// (4,096 of 4 MiB each would be 16 GiB).
#[test]
fn stalled_puts_of_a_chunk_hold_no_more_memory_than_the_streamed_bytes_bound() {
    const STALLED: usize = 64;
    const STREAMED_BYTES_MAX: u64 = 128 << 20;
    /// Connection buffers, the allocator's slack and the like.
    const OVERHEAD_BYTES_MAX: u64 = 32 << 20;
    let scratch = Scratch::new("s3-hostile-stalled-memory");
    let (server, address) = start(&scratch, &[]);
    assert_serves(&address, "the start");
    let baseline = server.resident_bytes();
    let body = object_bytes(70, CHUNK_BYTES - 1);
    let stalled: Vec<TcpStream> = (0..STALLED)
        .map(|index| stalled_put(&address, &format!("stalled-{index}"), CHUNK_BYTES, &body))
        .collect();
    let growth = settled_resident_bytes(&server).saturating_sub(baseline);
    eprintln!(
        "{STALLED} PUTs stalled one byte short of {} MiB: {} MiB more resident",
        CHUNK_BYTES >> 20,
        growth >> 20
    );
    drop(stalled);
    assert_absent(&address, "stalled-0", "stalled PUTs");
    assert_serves(&address, "stalled PUTs");
    assert!(
        growth < STREAMED_BYTES_MAX + OVERHEAD_BYTES_MAX,
        "{STALLED} stalled PUTs of {} MiB hold {} MiB, more than the {} MiB streamed-bytes bound",
        CHUNK_BYTES >> 20,
        growth >> 20,
        STREAMED_BYTES_MAX >> 20
    );
}

/// A raw S3 request without a body on a fresh connection.
fn bodiless(address: &str, method: &str, target: &str) -> Answer {
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: s3\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    answered(exchange(address, request.as_bytes()), method)
}

/// CompleteMultipartUpload of upload `id` of `key` with its part 1, as `uploaded` answered it.
/// The Complete names the part's CRC32C when its UploadPart answered one, as SDKs do.
fn complete_one_part(address: &str, key: &str, id: &str, uploaded: &Answer) -> Answer {
    let etag = uploaded.header("ETag").expect("the part's ETag");
    let checksum = uploaded
        .header("x-amz-checksum-crc32c")
        .map(|value| format!("<ChecksumCRC32C>{value}</ChecksumCRC32C>"))
        .unwrap_or_default();
    let body = format!(
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag>{checksum}</Part></CompleteMultipartUpload>"
    );
    let request = format!(
        "POST /{BUCKET}/{key}?uploadId={id} HTTP/1.1\r\nHost: s3\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    answered(exchange(address, request.as_bytes()), "Complete")
}

/// The text of the first `<tag>` of an XML answer.
fn xml_field(answer: &Answer, tag: &str) -> Option<String> {
    let text = answer.text();
    let start = text.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = start + text[start..].find(&format!("</{tag}>"))?;
    Some(text[start..end].to_string())
}

/// docs/s3.md: a multipart upload that is neither completed nor aborted is aborted after the
/// endpoint's expiry (`--s3-upload-expiry`), and its parts no longer hold the node's NVMe: a
/// client that begins uploads and walks away cannot fill the node or its 1,000 uploads.
#[test]
fn an_abandoned_multipart_upload_expires_and_its_parts_are_freed() {
    let scratch = Scratch::new("s3-upload-expiry");
    let (server, address) = start(&scratch, &["--s3-upload-expiry", "2s"]);
    let objects_before = server.metric("hydrant_objects");
    let created = bodiless(&address, "POST", &format!("/{BUCKET}/abandoned?uploads"));
    assert_eq!(created.status, 200, "{}", created.text());
    let id = xml_field(&created, "UploadId").expect("an UploadId");
    let part = object_bytes(41, 1 << 20);
    let mut request = format!(
        "PUT /{BUCKET}/abandoned?partNumber=1&uploadId={id} HTTP/1.1\r\nHost: s3\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        part.len()
    )
    .into_bytes();
    request.extend_from_slice(&part);
    let uploaded = answered(exchange(&address, &request), "UploadPart");
    assert_eq!(uploaded.status, 200, "{}", uploaded.text());
    // The upload's record, the part's bytes and the part's marker.
    assert_eq!(server.metric("hydrant_objects"), objects_before + 3);
    let listed = bodiless(&address, "GET", &format!("/{BUCKET}?uploads"));
    assert_eq!(xml_field(&listed, "UploadId").as_deref(), Some(id.as_str()));

    // Past the expiry, the sweep (every second at this expiry) aborts it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("hydrant_objects") > objects_before {
        assert!(
            Instant::now() < deadline,
            "the abandoned upload's staged objects are still held: {} objects, {objects_before} before",
            server.metric("hydrant_objects")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let listed = bodiless(&address, "GET", &format!("/{BUCKET}?uploads"));
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(xml_field(&listed, "UploadId"), None, "{}", listed.text());
    let parts = bodiless(
        &address,
        "GET",
        &format!("/{BUCKET}/abandoned?uploadId={id}"),
    );
    assert_eq!(parts.status, 404, "{}", parts.text());
    assert_eq!(parts.error_code().as_deref(), Some("NoSuchUpload"));
    let completed = complete_one_part(&address, "abandoned", &id, &uploaded);
    assert_eq!(completed.status, 404, "{}", completed.text());
    assert_eq!(completed.error_code().as_deref(), Some("NoSuchUpload"));
    assert_absent(&address, "abandoned", "an expired upload");
    assert_serves(&address, "an expired upload");
}

/// An unsigned aws-chunked PUT or UploadPart of `data` to `target`, whole.
fn aws_chunked_request(target: &str, data: &[u8], framed: &[u8]) -> Vec<u8> {
    let head = format!(
        "PUT {target} HTTP/1.1\r\nHost: s3\r\nContent-Encoding: aws-chunked\r\n\
         x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER\r\nx-amz-trailer: x-amz-checksum-crc32c\r\n\
         x-amz-decoded-content-length: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        data.len(),
        framed.len()
    );
    [head.as_bytes(), framed].concat()
}

/// docs/s3.md: SDKs that put a checksum in a trailer send the body as unsigned aws-chunked;
/// an endpoint without keys decodes it, checks the trailer's checksum before the PUT is
/// acknowledged, and stores nothing when the checksum or the framing is wrong.
#[test]
fn an_unsigned_aws_chunked_put_is_decoded_and_its_trailing_checksum_checked() {
    let scratch = Scratch::new("s3-aws-chunked");
    let (_server, address) = start(&scratch, &[]);
    for (key, bytes, piece) in [
        ("small", 1000, 64 << 10),
        ("pieces", 100_000, 8192),
        ("large", 2 * CHUNK_BYTES + 4321, 64 << 10),
        ("empty", 0, 64 << 10),
    ] {
        let data = object_bytes(50 + bytes as u64, bytes);
        let framed = aws_chunked(&data, piece, &crc32c_base64(&data));
        let answer = answered(
            exchange(
                &address,
                &aws_chunked_request(&format!("/{BUCKET}/{key}"), &data, &framed),
            ),
            key,
        );
        assert_eq!(answer.status, 200, "{key}: {}", answer.text());
        assert_eq!(
            answer.header("x-amz-checksum-crc32c"),
            Some(crc32c_base64(&data).as_str()),
            "{key}: the checksum is answered"
        );
        assert_holds(&address, key, &data, key);
    }

    // A trailer whose checksum is not the body's: BadDigest, nothing stored, the old kept.
    let old = object_bytes(60, 5000);
    assert_eq!(put(&address, "overwritten", &old).status, 200);
    let data = object_bytes(61, 300_000);
    let framed = aws_chunked(&data, 64 << 10, &crc32c_base64(b"other bytes"));
    let answer = answered(
        exchange(
            &address,
            &aws_chunked_request(&format!("/{BUCKET}/overwritten"), &data, &framed),
        ),
        "a wrong trailer",
    );
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.error_code().as_deref(), Some("BadDigest"));
    assert_holds(&address, "overwritten", &old, "a wrong trailing checksum");

    // Framing that lies: a chunk longer than its size, a missing trailer.
    let mut long_chunk = aws_chunked(&data, 64 << 10, &crc32c_base64(&data));
    long_chunk.splice(5..5, *b"XX");
    let outcome = exchange(
        &address,
        &aws_chunked_request(&format!("/{BUCKET}/lying"), &data, &long_chunk),
    );
    assert_refused(&outcome, &[], "a chunk longer than its size");
    assert_absent(&address, "lying", "a chunk longer than its size");
    let mut no_trailer = aws_chunked(&data, 64 << 10, "");
    let end = no_trailer.len();
    no_trailer.truncate(end - "x-amz-checksum-crc32c:\r\n\r\n".len());
    no_trailer.extend_from_slice(b"\r\n");
    let outcome = exchange(
        &address,
        &aws_chunked_request(&format!("/{BUCKET}/untrailed"), &data, &no_trailer),
    );
    assert_refused(&outcome, &[], "no trailer");
    assert_absent(&address, "untrailed", "no trailer");

    // UploadPart takes the same bodies.
    let created = bodiless(&address, "POST", &format!("/{BUCKET}/assembled?uploads"));
    let id = xml_field(&created, "UploadId").expect("an UploadId");
    let framed = aws_chunked(&data, 64 << 10, &crc32c_base64(&data));
    let uploaded = answered(
        exchange(
            &address,
            &aws_chunked_request(
                &format!("/{BUCKET}/assembled?partNumber=1&uploadId={id}"),
                &data,
                &framed,
            ),
        ),
        "UploadPart",
    );
    assert_eq!(uploaded.status, 200, "{}", uploaded.text());
    let completed = complete_one_part(&address, "assembled", &id, &uploaded);
    assert_eq!(completed.status, 200, "{}", completed.text());
    assert_holds(
        &address,
        "assembled",
        &data,
        "an upload of aws-chunked parts",
    );
    // A part of several chunks whose checksum comes in the trailer: verified, answered and kept
    // (with its last chunk), so the object answers the COMPOSITE checksum of its one part.
    let large = object_bytes(62, 2 * CHUNK_BYTES + 4321);
    let created = bodiless(&address, "POST", &format!("/{BUCKET}/trailed?uploads"));
    let id = xml_field(&created, "UploadId").expect("an UploadId");
    let framed = aws_chunked(&large, 64 << 10, &crc32c_base64(&large));
    let uploaded = answered(
        exchange(
            &address,
            &aws_chunked_request(
                &format!("/{BUCKET}/trailed?partNumber=1&uploadId={id}"),
                &large,
                &framed,
            ),
        ),
        "UploadPart of several chunks",
    );
    assert_eq!(uploaded.status, 200, "{}", uploaded.text());
    assert_eq!(
        uploaded.header("x-amz-checksum-crc32c"),
        Some(crc32c_base64(&large).as_str())
    );
    let completed = complete_one_part(&address, "trailed", &id, &uploaded);
    assert_eq!(completed.status, 200, "{}", completed.text());
    assert_holds(&address, "trailed", &large, "an upload of a trailed part");
    let request = format!(
        "GET /{BUCKET}/trailed HTTP/1.1\r\nHost: s3\r\nx-amz-checksum-mode: ENABLED\r\nConnection: close\r\n\r\n"
    );
    let answer = answered(exchange(&address, request.as_bytes()), "GET");
    let composite = format!("{}-1", crc32c_base64(&crc32c::crc32c(&large).to_be_bytes()));
    assert_eq!(
        answer.header("x-amz-checksum-crc32c"),
        Some(composite.as_str())
    );
    assert_serves(&address, "aws-chunked PUTs");
}

/// `writers` PUTs of `key` with `condition` (a header line) sent at once: each sends its head
/// and half its body, and the rest only once every writer has (so every request's early check
/// has seen the key as it was before any of them). Their statuses, and the bytes each sent.
fn racing_conditional_puts(
    address: &str,
    key: &str,
    condition: &str,
    writers: u64,
    bytes: usize,
) -> Vec<(u16, Vec<u8>)> {
    let halfway = std::sync::Arc::new(std::sync::Barrier::new(writers as usize));
    let threads: Vec<_> = (0..writers)
        .map(|writer| {
            let (address, key, condition) = (address.to_string(), key.to_string(), condition.to_string());
            let halfway = halfway.clone();
            std::thread::spawn(move || {
                let data = object_bytes(700 + writer, bytes);
                let head = format!(
                    "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: s3\r\n{condition}\r\nContent-Length: {bytes}\r\nConnection: close\r\n\r\n"
                );
                let mut stream = connect(&address);
                stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                send(&mut stream, head.as_bytes());
                send(&mut stream, &data[..bytes / 2]);
                halfway.wait();
                send(&mut stream, &data[bytes / 2..]);
                let answer = answered(read_outcome(&mut BufReader::new(stream)), "a racing PUT");
                (answer.status, data)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .collect()
}

/// The bytes of the one racing PUT that got 200; every other got 412.
fn the_one_winner<'a>(outcomes: &'a [(u16, Vec<u8>)], what: &str) -> &'a [u8] {
    let statuses: Vec<u16> = outcomes.iter().map(|(status, _)| *status).collect();
    let won: Vec<_> = outcomes
        .iter()
        .filter(|(status, _)| *status == 200)
        .collect();
    assert_eq!(won.len(), 1, "{what}: statuses {statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|status| *status == 200 || *status == 412),
        "{what}: the others are refused with 412, statuses {statuses:?}"
    );
    &won[0].1
}

#[test]
fn of_conditional_puts_racing_for_one_key_exactly_one_wins() {
    let scratch = Scratch::new("s3-conditional-race");
    let (_server, address) = start(&scratch, &[]);
    // Whole in one chunk, and streamed a chunk at a time.
    for (key, bytes) in [
        ("created-small", 1 << 20),
        ("created-large", 2 * CHUNK_BYTES + 5),
    ] {
        let outcomes = racing_conditional_puts(&address, key, "If-None-Match: *", 6, bytes);
        let won = the_one_winner(&outcomes, &format!("If-None-Match: * on {key}"));
        assert_holds(&address, key, won, "the race");
    }
    // If-Match on the version all of them read: one replaces it, the others find it replaced.
    let first = object_bytes(1, 1 << 20);
    let etag = put(&address, "replaced", &first)
        .header("etag")
        .expect("an ETag")
        .to_string();
    let outcomes = racing_conditional_puts(
        &address,
        "replaced",
        &format!("If-Match: {etag}"),
        6,
        1 << 20,
    );
    let won = the_one_winner(&outcomes, "If-Match");
    assert_holds(&address, "replaced", won, "the If-Match race");
    assert_serves(&address, "the races");
}
