//! The control endpoint: statistics, resetting them, settings.

mod common;

use common::{start_proxy, Client, Upstream};
use hydrant_fault_proxy::Method;

#[test]
fn stats_count_methods_bytes_and_gets_per_path() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    for _ in 0..3 {
        client.get("/bytes/10").unwrap();
    }
    client.get("/bytes/20?versionId=1").unwrap();
    client.request("HEAD", "/bytes/20", &[]).unwrap();
    client.request("PUT", "/bucket/key", &[1; 30]).unwrap();
    client.request("DELETE", "/bucket/key", &[]).unwrap();

    let stats = proxy.stats();
    assert_eq!(stats.total.requests, 7);
    assert_eq!(stats.total.forwarded, 7);
    assert_eq!(stats.method(Method::Get).requests, 4);
    assert_eq!(stats.method(Method::Head).requests, 1);
    assert_eq!(stats.method(Method::Put).requests, 1);
    assert_eq!(stats.method(Method::Delete).requests, 1);
    assert_eq!(stats.method(Method::Post).requests, 0);
    assert_eq!(stats.gets_of("/bytes/10"), 3);
    assert_eq!(stats.gets_of("/bytes/20"), 1);
    assert_eq!(stats.get_paths.len(), 2);
    assert_eq!(stats.request_body_bytes, 30);
    assert_eq!(
        stats.response_body_bytes,
        3 * 10 + 20 + "received 30".len() as u64
    );

    let answer = client.get("/__proxy/stats").unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.field("content-type"), Some("application/json"));
    let json = answer.text();
    assert_eq!(json, stats.to_json());
    assert!(
        json.contains("\"get_paths\":{\"/bytes/10\":3,\"/bytes/20\":1}"),
        "{json}"
    );
    assert!(json.contains("\"GET\":{\"requests\":4,\"forwarded\":4,\"faulted\":0,\"failed\":0}"));

    let reset = client.request("POST", "/__proxy/reset", &[]).unwrap();
    assert_eq!(reset.status, 200);
    let stats = proxy.stats();
    assert_eq!(stats.total.requests, 0);
    assert!(stats.get_paths.is_empty());
    // Control requests are neither forwarded nor counted.
    assert_eq!(upstream.request_count(), 7);
}

#[test]
fn bad_control_requests_are_refused() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |_| {});
    let mut client = Client::connect(proxy.addr());
    assert_eq!(client.get("/__proxy/nothing").unwrap().status, 404);
    assert_eq!(
        client
            .request("DELETE", "/__proxy/stats", &[])
            .unwrap()
            .status,
        405
    );
    let refused = client
        .request("PUT", "/__proxy/config?fault_rate=2", &[])
        .unwrap();
    assert_eq!(refused.status, 400);
    assert!(refused.text().contains("fault_rate"), "{}", refused.text());
    assert_eq!(
        client
            .request("PUT", "/__proxy/config?speed=fast", &[])
            .unwrap()
            .status,
        400
    );
    assert_eq!(proxy.settings().fault_rate, 0.0);
    let config = client.get("/__proxy/config").unwrap();
    assert!(config
        .text()
        .contains("\"faults\":[\"503\",\"500\",\"reset\"]"));
    assert_eq!(upstream.request_count(), 0);
}
