//! The S3 endpoint answers a plain GET (anonymous, from loopback, a whole object or one range)
//! on a path of its own, without the S3 library's routing. Its answers must be the library's
//! answers: each GET here is sent twice to a real server process, once plain and once with a
//! header that GetObject accepts and this gateway ignores (`x-amz-request-payer`), which sends
//! it the library's way; status, headers (but Date) and body must match, and the metrics must
//! show which way each went.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{aws_chunked, crc32c_base64, object_bytes, Scratch, ServerProcess};

/// An HTTP answer: status, headers (names lowercase, sorted, Date left out) and body.
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// One request on a connection of its own (`Connection: close`), read to the end.
fn exchange(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    if method == "PUT" {
        request += &format!("Content-Length: {}\r\n", body.len());
    }
    request += "\r\n";
    stream.write_all(request.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let end = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("an answer with headers");
    let head = String::from_utf8(answer[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_string())
        })
        .filter(|(name, _)| name != "date" && name != "connection")
        .collect();
    headers.sort();
    Answer {
        status,
        headers,
        body: answer[end + 4..].to_vec(),
    }
}

#[test]
fn plain_gets_answer_as_s3s_does() {
    let scratch = Scratch::new("s3-plain-get");
    let server = ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    let endpoint = server.s3_endpoint();
    let address = endpoint.trim_start_matches("http://").to_string();
    let put = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        let answer = exchange(&address, "PUT", path, headers, body);
        assert_eq!(answer.status, 200, "PUT {path}: {answer:?}");
    };
    assert_eq!(exchange(&address, "PUT", "/plain", &[], b"").status, 200);
    // Every kept header and user metadata; a body of three 4 MiB chunks; an empty object.
    let small = object_bytes(1, 5000);
    put(
        "/plain/dressed",
        &[
            ("Content-Type", "text/csv"),
            ("Cache-Control", "max-age=60"),
            ("Content-Disposition", "attachment; filename=\"a.csv\""),
            ("Content-Encoding", "gzip"),
            ("Content-Language", "en"),
            ("Expires", "Wed, 21 Oct 2037 07:28:00 GMT"),
            ("x-amz-meta-Owner", "trainer"),
            ("x-amz-meta-step", "1200"),
        ],
        &small,
    );
    let large = object_bytes(2, 9 << 20);
    put("/plain/large", &[], &large);
    // Checksums given in a header (one object of one chunk, one of three) and in a trailer.
    let summed = crc32c_base64(&small);
    put(
        "/plain/summed",
        &[("x-amz-checksum-crc32c", &summed)],
        &small,
    );
    let large_summed = crc32c_base64(&large);
    put(
        "/plain/large-summed",
        &[("x-amz-checksum-crc32c", &large_summed)],
        &large,
    );
    let trailed = aws_chunked(&small, 1000, &summed);
    let decoded = small.len().to_string();
    put(
        "/plain/trailed",
        &[
            ("Content-Encoding", "aws-chunked"),
            ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
            ("x-amz-trailer", "x-amz-checksum-crc32c"),
            ("x-amz-decoded-content-length", &decoded),
        ],
        &trailed,
    );
    // A trailer after a body of three chunks: its value is kept with the last one.
    let large_trailed = aws_chunked(&large, 64 << 10, &large_summed);
    let large_decoded = large.len().to_string();
    put(
        "/plain/large-trailed",
        &[
            ("Content-Encoding", "aws-chunked"),
            ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
            ("x-amz-trailer", "x-amz-checksum-crc32c"),
            ("x-amz-decoded-content-length", &large_decoded),
        ],
        &large_trailed,
    );
    // A checksum both in a header and in a trailer is refused (only one would be verified),
    // and nothing is stored.
    let wrong = crc32c_base64(b"other bytes");
    let both = exchange(
        &address,
        "PUT",
        "/plain/both",
        &[
            ("Content-Encoding", "aws-chunked"),
            ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
            ("x-amz-trailer", "x-amz-checksum-crc32c"),
            ("x-amz-checksum-crc32c", &wrong),
            ("x-amz-decoded-content-length", &decoded),
        ],
        &trailed,
    );
    assert_eq!(both.status, 400, "{both:?}");
    assert!(String::from_utf8_lossy(&both.body).contains("<Code>InvalidRequest</Code>"));
    assert_eq!(
        exchange(&address, "GET", "/plain/both", &[], b"").status,
        404
    );
    put("/plain/empty", &[], b"");
    put("/plain/dir/a%20b+c", &[], &small);

    let gets: &[(&str, Option<&str>)] = &[
        ("/plain/dressed", None),
        ("/plain/summed", None),
        ("/plain/summed", Some("bytes=10-19")),
        ("/plain/trailed", None),
        ("/plain/large-summed", None),
        ("/plain/large-trailed", None),
        ("/plain/dressed", Some("bytes=10-19")),
        ("/plain/dressed", Some("bytes=-7")),
        ("/plain/dressed", Some("bytes=4990-")),
        ("/plain/dressed", Some("bytes=4990-999999")),
        ("/plain/dressed", Some("bytes=5000-")),
        ("/plain/large", None),
        ("/plain/large", Some("bytes=4194000-8389000")),
        ("/plain/large", Some("bytes=-5000000")),
        ("/plain/empty", None),
        ("/plain/dir/a%20b+c", None),
        ("/plain/missing", None),
        ("/other-bucket/missing", None),
        // Names that try to leave their bucket or that the grammar refuses.
        ("/plain/../plain/dressed", None),
        ("/plain/./dressed", None),
        ("/plain//dressed", None),
        ("/Bad_Bucket/dressed", None),
    ];
    let plain_before = server.metric("hydrant_s3_plain_gets_total");
    // Each GET with and without asking for the object's checksum.
    for (path, range) in gets {
        for checksum_mode in [None, Some("ENABLED")] {
            let mut headers = Vec::new();
            if let Some(range) = range {
                headers.push(("Range", *range));
            }
            if let Some(mode) = checksum_mode {
                headers.push(("x-amz-checksum-mode", mode));
            }
            let plain = exchange(&address, "GET", path, &headers, b"");
            headers.push(("x-amz-request-payer", "requester"));
            let routed = exchange(&address, "GET", path, &headers, b"");
            assert_eq!(plain, routed, "GET {path} {range:?} {checksum_mode:?}");
        }
    }
    // The checksum comes back for the whole object when asked, as it was sent (in a header
    // or a trailer), and not for a range or when not asked.
    let header = |answer: &Answer, name: &str| {
        answer
            .headers
            .iter()
            .find(|(found, _)| found == name)
            .map(|(_, value)| value.clone())
    };
    let asked = [("x-amz-checksum-mode", "ENABLED")];
    for (path, sum) in [
        ("/plain/summed", &summed),
        ("/plain/trailed", &summed),
        ("/plain/large-summed", &large_summed),
        ("/plain/large-trailed", &large_summed),
    ] {
        let answer = exchange(&address, "GET", path, &asked, b"");
        assert_eq!(
            header(&answer, "x-amz-checksum-crc32c").as_ref(),
            Some(sum),
            "{path}"
        );
        assert_eq!(
            header(&answer, "x-amz-checksum-type").as_deref(),
            Some("FULL_OBJECT")
        );
        let head = exchange(&address, "HEAD", path, &asked, b"");
        assert_eq!(
            header(&head, "x-amz-checksum-crc32c").as_ref(),
            Some(sum),
            "HEAD {path}"
        );
        let unasked = exchange(&address, "GET", path, &[], b"");
        assert_eq!(header(&unasked, "x-amz-checksum-crc32c"), None, "{path}");
    }
    let ranged = exchange(
        &address,
        "GET",
        "/plain/summed",
        &[asked[0], ("Range", "bytes=0-9")],
        b"",
    );
    assert_eq!(header(&ranged, "x-amz-checksum-crc32c"), None);
    let plain_before = plain_before + 4 + 4 + 1;
    // The bodies are the objects' bytes, and the errors what they should be.
    let whole = exchange(&address, "GET", "/plain/large", &[], b"");
    assert_eq!(whole.status, 200);
    assert!(whole.body == large, "the large object's bytes");
    let range = exchange(
        &address,
        "GET",
        "/plain/dressed",
        &[("Range", "bytes=10-19")],
        b"",
    );
    assert_eq!((range.status, &range.body[..]), (206, &small[10..20]));
    let missing = exchange(&address, "GET", "/plain/missing", &[], b"");
    assert_eq!(missing.status, 404);
    assert!(String::from_utf8_lossy(&missing.body).contains("<Code>NoSuchKey</Code>"));
    let unsatisfiable = exchange(
        &address,
        "GET",
        "/plain/dressed",
        &[("Range", "bytes=5000-")],
        b"",
    );
    assert_eq!(unsatisfiable.status, 416);
    assert!(String::from_utf8_lossy(&unsatisfiable.body)
        .contains("<ActualObjectSize>5000</ActualObjectSize>"));
    // Which way each went: the plain ones (but the name with a space, which needs decoding,
    // and the bucket name s3s refuses before any operation) and the four checks above on the
    // plain path, the rest through the library.
    let plain = server.metric("hydrant_s3_plain_gets_total") - plain_before;
    assert_eq!(plain, 2 * (gets.len() as u64 - 2) + 4);
}
/// A request's headers, (name, value).
type Headers<'a> = &'a [(&'a str, &'a str)];

/// What takes the library's way: a query string, a condition, a signature, an unknown
/// `x-amz-` header, a body. Each still gets GetObject's answer.
#[test]
fn gets_with_more_than_a_range_take_the_librarys_way() {
    let scratch = Scratch::new("s3-plain-get-not");
    let server = ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    let endpoint = server.s3_endpoint();
    let address = endpoint.trim_start_matches("http://").to_string();
    assert_eq!(exchange(&address, "PUT", "/bkt", &[], b"").status, 200);
    let bytes = object_bytes(3, 100);
    assert_eq!(exchange(&address, "PUT", "/bkt/k", &[], &bytes).status, 200);
    let etag = exchange(&address, "GET", "/bkt/k", &[], b"")
        .headers
        .into_iter()
        .find(|(name, _)| name == "etag")
        .unwrap()
        .1;
    let plain_before = server.metric("hydrant_s3_plain_gets_total");
    let requests: &[(&str, Headers, u16)] = &[
        ("/bkt/k?partNumber=1", &[], 200),
        ("/bkt/k?response-content-type=text/plain", &[], 200),
        ("/bkt/k", &[("If-None-Match", &etag)], 304),
        ("/bkt/k", &[("If-Match", "\"nope\"")], 412),
        (
            "/bkt/k",
            &[("x-amz-expected-bucket-owner", "123456789012")],
            200,
        ),
        ("/bkt/%6b", &[], 200),
    ];
    for (path, headers, status) in requests {
        let answer = exchange(&address, "GET", path, headers, b"");
        assert_eq!(answer.status, *status, "GET {path} {headers:?}: {answer:?}");
        if *status == 200 {
            assert_eq!(answer.body, bytes, "GET {path} {headers:?}");
        }
    }
    assert_eq!(
        server.metric("hydrant_s3_plain_gets_total"),
        plain_before,
        "none of these is a plain GET"
    );
}
