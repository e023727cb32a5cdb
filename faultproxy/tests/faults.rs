//! Injected faults: S3 errors answered without forwarding, and connection resets.

mod common;

use std::io;

use common::{pattern, start_proxy, Client, Upstream};
use hydrant_fault_proxy::{ConfigUpdate, FaultKind, Method};

#[test]
fn a_503_fault_answers_slow_down_without_forwarding() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.fault_rate = 1.0;
        config.settings.faults = vec![FaultKind::SlowDown];
    });
    let mut client = Client::connect(proxy.addr());
    let response = client.get("/bytes/100").unwrap();
    assert_eq!(response.status, 503);
    assert_eq!(response.field("content-type"), Some("application/xml"));
    assert!(response.text().contains(
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    ));
    // A faulted PUT's body is consumed, so the connection carries the next request.
    let put = client
        .request("PUT", "/bucket/key", &pattern(5000))
        .unwrap();
    assert_eq!(put.status, 503);
    let head = client.request("HEAD", "/bytes/100", &[]).unwrap();
    assert_eq!(head.status, 503);
    assert!(head.body.is_empty());
    assert_eq!(upstream.request_count(), 0);
    let stats = proxy.stats();
    assert_eq!(stats.total.faulted, 3);
    assert_eq!(stats.total.forwarded, 0);
    assert_eq!(stats.faults.slow_down, 3);
}

#[test]
fn a_500_fault_answers_internal_error_without_forwarding() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.fault_rate = 1.0;
        config.settings.faults = vec![FaultKind::InternalError];
    });
    let mut client = Client::connect(proxy.addr());
    let response = client.get("/bytes/100").unwrap();
    assert_eq!(response.status, 500);
    assert!(response.text().contains("<Code>InternalError</Code>"));
    assert_eq!(upstream.request_count(), 0);
    assert_eq!(proxy.stats().faults.internal_error, 1);
}

#[test]
fn a_reset_before_forwarding_is_a_connection_reset_at_the_client() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.fault_rate = 1.0;
        config.settings.faults = vec![FaultKind::ResetBeforeForwarding];
    });
    let mut client = Client::connect(proxy.addr());
    let error = client
        .get("/bytes/100")
        .err()
        .expect("the request succeeded");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
    assert_eq!(upstream.request_count(), 0);
    assert_eq!(proxy.stats().faults.reset_before_forwarding, 1);
}

#[test]
fn a_reset_mid_body_truncates_the_response_after_forwarding() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.fault_rate = 1.0;
        config.settings.faults = vec![FaultKind::ResetMidBody];
    });
    let mut client = Client::connect(proxy.addr());
    let result = client.get(&format!("/bytes/{}", 1 << 20));
    assert!(result.is_err(), "the whole body arrived");
    assert_eq!(upstream.request_count(), 1);
    let stats = proxy.stats();
    assert_eq!(stats.faults.reset_mid_body, 1);
    assert!(stats.response_body_bytes < 1 << 20);

    // A chunked body is cut too.
    let mut client = Client::connect(proxy.addr());
    assert!(client.get("/chunked/10000/1000").is_err());
}

#[test]
fn the_fault_rate_holds_within_a_binomial_bound() {
    const REQUESTS: u64 = 500;
    const RATE: f64 = 0.2;
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.fault_rate = RATE;
        config.settings.faults = vec![FaultKind::SlowDown];
        config.seed = 12345;
    });
    let mut client = Client::connect(proxy.addr());
    let mut faulted = 0;
    for _ in 0..REQUESTS {
        let response = client.get("/bytes/1").unwrap();
        if response.status == 503 {
            faulted += 1;
        } else {
            assert_eq!(response.status, 200);
        }
    }
    // Five standard deviations of Binomial(500, 0.2), about 45: loose enough never to fail by
    // chance, tight enough to catch a rate that is ignored or inverted.
    let mean = REQUESTS as f64 * RATE;
    let deviation = (REQUESTS as f64 * RATE * (1.0 - RATE)).sqrt();
    assert!(
        (faulted as f64 - mean).abs() <= 5.0 * deviation,
        "{faulted} of {REQUESTS} faulted"
    );
    let stats = proxy.stats();
    assert_eq!(stats.total.faulted, faulted);
    assert_eq!(stats.total.forwarded, REQUESTS - faulted);
    assert_eq!(upstream.request_count(), REQUESTS - faulted);
}

#[test]
fn the_same_seed_repeats_the_same_faults() {
    let statuses = |seed: u64| -> Vec<u16> {
        let upstream = Upstream::start();
        let proxy = start_proxy(&upstream, |config| {
            config.settings.fault_rate = 0.5;
            config.settings.faults = vec![FaultKind::SlowDown, FaultKind::InternalError];
            config.seed = seed;
        });
        let mut client = Client::connect(proxy.addr());
        (0..60)
            .map(|_| client.get("/bytes/1").unwrap().status)
            .collect()
    };
    let first = statuses(7);
    assert_eq!(first, statuses(7));
    for status in [200, 500, 503] {
        assert!(first.contains(&status), "{status} never came: {first:?}");
    }
}

#[test]
fn faults_turn_on_and_off_at_run_time() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.faults = vec![FaultKind::SlowDown];
    });
    let mut client = Client::connect(proxy.addr());
    assert_eq!(client.get("/bytes/1").unwrap().status, 200);

    let answer = client
        .request("PUT", "/__proxy/config?fault_rate=1&faults=500", &[])
        .unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        answer.text().contains("\"fault_rate\":1"),
        "{}",
        answer.text()
    );
    assert_eq!(client.get("/bytes/1").unwrap().status, 500);

    let settings = proxy
        .set_config(ConfigUpdate {
            fault_rate: Some(0.0),
            ..ConfigUpdate::default()
        })
        .unwrap();
    assert_eq!(settings.faults, vec![FaultKind::InternalError]);
    assert_eq!(client.get("/bytes/1").unwrap().status, 200);
    assert_eq!(upstream.request_count(), 2);
    assert_eq!(proxy.stats().method(Method::Get).faulted, 1);
}

#[test]
fn a_fault_limit_injects_exactly_that_many_faults_then_forwards() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.fault_rate = 1.0;
        config.settings.faults = vec![FaultKind::SlowDown];
        config.settings.faults_left = Some(2);
    });
    let mut client = Client::connect(proxy.addr());
    let statuses: Vec<u16> = (0..4)
        .map(|_| client.get("/bytes/1").unwrap().status)
        .collect();
    assert_eq!(statuses, [503, 503, 200, 200]);
    assert_eq!(proxy.settings().faults_left, Some(0));

    let answer = client
        .request("PUT", "/__proxy/config?fault_limit=1", &[])
        .unwrap();
    assert!(
        answer.text().contains("\"faults_left\":1"),
        "{}",
        answer.text()
    );
    assert_eq!(client.get("/bytes/1").unwrap().status, 503);
    assert_eq!(client.get("/bytes/1").unwrap().status, 200);
    assert_eq!(upstream.request_count(), 3);
    assert_eq!(proxy.stats().method(Method::Get).faulted, 3);
}
