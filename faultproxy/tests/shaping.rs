//! Latency and bandwidth shaping. Only lower bounds on time are asserted: a loaded machine may
//! be slower, never faster.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, start_proxy, Client, Upstream};
use hydrant_fault_proxy::DelayRange;

#[test]
fn each_request_is_delayed() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.delay = DelayRange {
            min_ms: 100,
            max_ms: 100,
        };
    });
    let mut client = Client::connect(proxy.addr());
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(client.get("/bytes/1").unwrap().status, 200);
        assert!(started.elapsed() >= Duration::from_millis(100));
    }
}

#[test]
fn bandwidth_caps_downloads_and_uploads() {
    const RATE_BYTES_PER_SECOND: u64 = 2 << 20;
    const BODY_BYTES: usize = 1 << 20;
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.bandwidth_bytes_per_second = RATE_BYTES_PER_SECOND;
    });
    // 1 MiB at 2 MiB/s is 0.5 s, less the 100 ms burst the bucket starts with.
    let lower_bound = Duration::from_millis(380);
    let mut client = Client::connect(proxy.addr());

    let started = Instant::now();
    let response = client.get(&format!("/bytes/{BODY_BYTES}")).unwrap();
    assert!(response.body == pattern(BODY_BYTES));
    assert!(started.elapsed() >= lower_bound, "{:?}", started.elapsed());

    // Starting a new bucket with a runtime change resets the burst for the upload.
    proxy
        .set_config(hydrant_fault_proxy::ConfigUpdate {
            bandwidth_bytes_per_second: Some(RATE_BYTES_PER_SECOND),
            ..Default::default()
        })
        .unwrap();
    let started = Instant::now();
    let response = client
        .request("PUT", "/bucket/key", &pattern(BODY_BYTES))
        .unwrap();
    assert_eq!(response.text(), format!("received {BODY_BYTES}"));
    assert!(started.elapsed() >= lower_bound, "{:?}", started.elapsed());
}

#[test]
fn a_zero_bandwidth_removes_the_cap_at_run_time() {
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, |config| {
        config.settings.bandwidth_bytes_per_second = 1024;
    });
    proxy
        .set_config(hydrant_fault_proxy::ConfigUpdate::from_query("bandwidth=0").unwrap())
        .unwrap();
    let mut client = Client::connect(proxy.addr());
    // At 1 KiB/s this would take over a minute; the test would time out, not pass.
    let response = client.get(&format!("/bytes/{}", 4 << 20)).unwrap();
    assert_eq!(response.body.len(), 4 << 20);
}
