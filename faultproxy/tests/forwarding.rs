//! Requests and responses pass through the proxy byte for byte, over kept-alive connections.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};

use common::{chunked_encoding, pattern, start_proxy, Client, Upstream};
use hydrant_fault_proxy::{Method, HEAD_BYTES_MAX};

const TEN_MIB: usize = 10 << 20;

#[test]
fn a_ten_mib_body_arrives_exactly() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    let response = client.get(&format!("/bytes/{TEN_MIB}")).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.body.len(), TEN_MIB);
    assert!(response.body == pattern(TEN_MIB), "the body differs");
    let stats = proxy.stats();
    assert_eq!(stats.response_body_bytes, TEN_MIB as u64);
    assert_eq!(stats.method(Method::Get).forwarded, 1);
}

#[test]
fn a_chunked_response_is_copied_verbatim_with_its_trailer() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    let response = client.get("/chunked/100000/7000").unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.field("transfer-encoding"), Some("chunked"));
    let expected_raw = chunked_encoding(&pattern(100_000), 7000);
    assert!(
        response.raw_body == expected_raw,
        "the chunked stream differs"
    );
    assert!(response.body == pattern(100_000));
    assert_eq!(proxy.stats().response_body_bytes, expected_raw.len() as u64);
    // The proxy found the end of the chunked stream: the connection carries another request.
    assert_eq!(client.get("/bytes/5").unwrap().body, pattern(5));
}

#[test]
fn request_bodies_are_forwarded_by_length_and_chunked() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    let body = pattern(1 << 20);
    let response = client.request("PUT", "/bucket/key", &body).unwrap();
    assert_eq!(response.text(), "received 1048576");

    let chunked = chunked_encoding(&pattern(50_000), 4096);
    client
        .send_raw(b"POST /bucket/key?uploads HTTP/1.1\r\nHost: s3.test\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    client.send_raw(&chunked).unwrap();
    let response = client.read_response(false).unwrap();
    assert_eq!(response.text(), "received 50000");

    let stats = proxy.stats();
    assert_eq!(stats.request_body_bytes, (1 << 20) + chunked.len() as u64);
    assert_eq!(stats.method(Method::Put).forwarded, 1);
    assert_eq!(stats.method(Method::Post).forwarded, 1);
    assert_eq!(upstream.connection_count(), 1);
}

#[test]
fn expect_continue_is_relayed_before_the_body_is_sent() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    client
        .send_raw(b"PUT /bucket/key HTTP/1.1\r\nHost: s3.test\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n")
        .unwrap();
    let interim = client.read_response(false).unwrap();
    assert_eq!(interim.status, 100);
    client.send_raw(&pattern(1000)).unwrap();
    let response = client.read_response(false).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "received 1000");
    assert_eq!(client.get("/bytes/3").unwrap().body, pattern(3));
}

#[test]
fn head_and_204_responses_carry_no_body_and_keep_the_connection() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    let head = client.request("HEAD", "/bytes/1000", &[]).unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(head.field("content-length"), Some("1000"));
    assert!(head.body.is_empty());
    let deleted = client.request("DELETE", "/bucket/key", &[]).unwrap();
    assert_eq!(deleted.status, 204);
    // Had the proxy waited for a body after either, this request would hang or come back wrong.
    let response = client.get("/bytes/10").unwrap();
    assert_eq!(response.body, pattern(10));
    let stats = proxy.stats();
    assert_eq!(stats.response_body_bytes, 10);
    assert_eq!(stats.method(Method::Head).forwarded, 1);
    assert_eq!(stats.method(Method::Delete).forwarded, 1);
}

#[test]
fn several_requests_share_one_connection_on_each_side() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    for length in [1, 10, 100, 1000, 10_000] {
        let response = client.get(&format!("/bytes/{length}")).unwrap();
        assert_eq!(response.body, pattern(length));
    }
    assert_eq!(proxy.stats().connections_accepted, 1);
    assert_eq!(upstream.connection_count(), 1);
    assert_eq!(upstream.request_count(), 5);
}

#[test]
fn an_oversized_head_is_answered_with_431_and_not_forwarded() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    let filler = "a".repeat(HEAD_BYTES_MAX + 1024);
    client
        .send_raw(
            format!("GET /bytes/1 HTTP/1.1\r\nHost: s3.test\r\nX-Filler: {filler}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    let response = client.read_response(false).unwrap();
    assert_eq!(response.status, 431);
    assert_eq!(upstream.request_count(), 0);

    // A head just under the limit is forwarded.
    let mut client = Client::connect(proxy.addr());
    let filler = "a".repeat(HEAD_BYTES_MAX - 1024);
    client
        .send_raw(
            format!("GET /bytes/2 HTTP/1.1\r\nHost: s3.test\r\nX-Filler: {filler}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(client.read_response(false).unwrap().body, pattern(2));
}

#[test]
fn a_malformed_request_is_answered_with_400() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    client.send_raw(b"GET /bytes/1 HTTP/9.9\r\n\r\n").unwrap();
    assert_eq!(client.read_response(false).unwrap().status, 400);
    assert_eq!(upstream.request_count(), 0);
}

#[test]
fn an_unreachable_upstream_is_answered_with_502() {
    let closed_port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut config = hydrant_fault_proxy::Config::new(closed_port.to_string());
    config.settings.delay = hydrant_fault_proxy::DelayRange::NONE;
    let proxy = hydrant_fault_proxy::start(config).unwrap();
    let mut client = Client::connect(proxy.addr());
    assert_eq!(client.get("/bytes/1").unwrap().status, 502);
    assert_eq!(proxy.stats().total.failed, 1);
}

#[test]
fn connections_beyond_the_limit_are_refused() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| config.connections_max = 1);
    let mut first = Client::connect(proxy.addr());
    assert_eq!(first.get("/bytes/1").unwrap().status, 200);
    let mut second = Client::connect(proxy.addr());
    assert!(second.get("/bytes/1").is_err());
    assert_eq!(proxy.stats().connections_refused, 1);
    // The first connection is unaffected.
    assert_eq!(first.get("/bytes/2").unwrap().body, pattern(2));
}

#[test]
fn the_binary_prints_its_address_first_and_forwards() {
    let upstream = Upstream::start();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hydrant-fault-proxy"))
        .args([
            "--upstream",
            &upstream.address.to_string(),
            "--delay-ms",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    let address = first_line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first_line:?}"));
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .write_all(b"GET /__proxy/config HTTP/1.1\r\nHost: s3.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    let mut client = Client::connect(address.parse().unwrap());
    let response = client.get("/bytes/7");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"delay_ms\":\"0-0\""), "{answer}");
    assert_eq!(response.unwrap().body, pattern(7));
}

#[test]
fn a_kept_upstream_connection_closed_unanswered_is_retried_once_for_a_bodiless_request() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    for length in [3, 4, 5] {
        assert_eq!(
            client.get(&format!("/once/{length}")).unwrap().body,
            pattern(length)
        );
    }
    // Each later request was sent on the kept connection, met a close, and went again on a new
    // one.
    assert_eq!(upstream.request_count(), 5);
    assert_eq!(upstream.connection_count(), 3);
    assert_eq!(proxy.stats().total.forwarded, 3);
    assert_eq!(proxy.stats().total.failed, 0);
}

#[test]
fn shutdown_closes_open_connections_and_stops_listening() {
    let upstream = Upstream::start();
    let mut proxy = start_proxy(&upstream, |_| {});
    let address = proxy.addr();
    let mut client = Client::connect(address);
    assert_eq!(client.get("/bytes/1").unwrap().status, 200);
    proxy.shutdown();
    assert!(client.get("/bytes/1").is_err());
    assert!(TcpStream::connect(address).is_err());
}
