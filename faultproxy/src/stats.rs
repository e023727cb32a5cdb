//! Counters of what the proxy saw and did, read by tests through `ProxyHandle::stats` or
//! `GET /__proxy/stats`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// The most distinct paths whose GETs are counted one by one; GETs of further paths are counted
/// together in `get_paths_untracked`, so that a long benchmark cannot grow the map without bound.
pub const GET_PATHS_TRACKED_MAX: usize = 65_536;

/// The request methods counted separately; every other method is counted as `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Put,
    Post,
    Delete,
    Other,
}

impl Method {
    pub const ALL: [Method; 6] = [
        Method::Get,
        Method::Head,
        Method::Put,
        Method::Post,
        Method::Delete,
        Method::Other,
    ];

    /// Methods are case-sensitive tokens (RFC 9110, section 9.1), so `get` is `Other`.
    pub fn from_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            _ => Method::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Other => "OTHER",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The fate of requests: every request is forwarded, faulted or failed (the upstream server
/// could not be reached or broke off), so `requests = forwarded + faulted + failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub requests: u64,
    pub forwarded: u64,
    pub faulted: u64,
    pub failed: u64,
}

/// Injected faults by what the client saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub slow_down: u64,
    pub internal_error: u64,
    pub reset_before_forwarding: u64,
    /// These requests did reach the upstream server, which acted on them.
    pub reset_mid_body: u64,
}

/// A fault as injected, after `reset` was resolved to one of its two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    SlowDown,
    InternalError,
    ResetBeforeForwarding,
    ResetMidBody,
}

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub total: RequestCounts,
    /// Indexed in the order of `Method::ALL`; read through `Stats::method`.
    pub methods: [RequestCounts; 6],
    pub faults: FaultCounts,
    /// Body bytes relayed from clients to the upstream server, chunked framing included.
    pub request_body_bytes: u64,
    /// Body bytes relayed from the upstream server to clients, chunked framing included.
    pub response_body_bytes: u64,
    /// GET requests received (forwarded or faulted) by path, the query string left out.
    pub get_paths: BTreeMap<String, u64>,
    /// GET requests of paths beyond the first `GET_PATHS_TRACKED_MAX`.
    pub get_paths_untracked: u64,
    pub connections_accepted: u64,
    /// Connections refused because `connections_max` were open.
    pub connections_refused: u64,
}

impl Stats {
    pub fn method(&self, method: Method) -> RequestCounts {
        self.methods[method.index()]
    }

    /// The GET requests received for `path`.
    pub fn gets_of(&self, path: &str) -> u64 {
        self.get_paths.get(path).copied().unwrap_or(0)
    }

    pub fn to_json(&self) -> String {
        let mut json = String::new();
        json.push_str("{\"total\":");
        write_counts(&mut json, &self.total);
        json.push_str(",\"methods\":{");
        for (position, method) in Method::ALL.into_iter().enumerate() {
            if position > 0 {
                json.push(',');
            }
            write!(json, "\"{}\":", method.name()).unwrap();
            write_counts(&mut json, &self.method(method));
        }
        let faults = &self.faults;
        write!(
            json,
            "}},\"faults\":{{\"slow_down\":{},\"internal_error\":{},\"reset_before_forwarding\":{},\"reset_mid_body\":{}}}",
            faults.slow_down,
            faults.internal_error,
            faults.reset_before_forwarding,
            faults.reset_mid_body
        )
        .unwrap();
        write!(
            json,
            ",\"request_body_bytes\":{},\"response_body_bytes\":{},\"get_paths\":{{",
            self.request_body_bytes, self.response_body_bytes
        )
        .unwrap();
        for (position, (path, count)) in self.get_paths.iter().enumerate() {
            if position > 0 {
                json.push(',');
            }
            write_json_string(&mut json, path);
            write!(json, ":{count}").unwrap();
        }
        write!(
            json,
            "}},\"get_paths_untracked\":{},\"connections_accepted\":{},\"connections_refused\":{}}}",
            self.get_paths_untracked, self.connections_accepted, self.connections_refused
        )
        .unwrap();
        json
    }
}

fn write_counts(json: &mut String, counts: &RequestCounts) {
    write!(
        json,
        "{{\"requests\":{},\"forwarded\":{},\"faulted\":{},\"failed\":{}}}",
        counts.requests, counts.forwarded, counts.faulted, counts.failed
    )
    .unwrap();
}

/// Writes `text` as a JSON string, escaping what RFC 8259 requires.
pub fn write_json_string(json: &mut String, text: &str) {
    json.push('"');
    for character in text.chars() {
        match character {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            '\n' => json.push_str("\\n"),
            '\r' => json.push_str("\\r"),
            '\t' => json.push_str("\\t"),
            control if (control as u32) < 0x20 => {
                write!(json, "\\u{:04x}", control as u32).unwrap()
            }
            other => json.push(other),
        }
    }
    json.push('"');
}

/// The live counters. One lock for all of them: it is taken a few times per request and once per
/// relayed buffer, far less often than it could contend.
#[derive(Default)]
pub struct Recorder {
    stats: Mutex<Stats>,
}

impl Recorder {
    pub fn snapshot(&self) -> Stats {
        self.stats.lock().unwrap().clone()
    }

    pub fn reset(&self) {
        *self.stats.lock().unwrap() = Stats::default();
    }

    pub fn request_received(&self, method: Method, path: &str) {
        let mut stats = self.stats.lock().unwrap();
        stats.total.requests += 1;
        stats.methods[method.index()].requests += 1;
        if method != Method::Get {
            return;
        }
        let tracked = stats.get_paths.len();
        match stats.get_paths.get_mut(path) {
            Some(count) => *count += 1,
            None if tracked < GET_PATHS_TRACKED_MAX => {
                stats.get_paths.insert(path.to_string(), 1);
            }
            None => stats.get_paths_untracked += 1,
        }
    }

    pub fn forwarded(&self, method: Method) {
        let mut stats = self.stats.lock().unwrap();
        stats.total.forwarded += 1;
        stats.methods[method.index()].forwarded += 1;
    }

    pub fn faulted(&self, method: Method, fault: Fault) {
        let mut stats = self.stats.lock().unwrap();
        stats.total.faulted += 1;
        stats.methods[method.index()].faulted += 1;
        let faults = &mut stats.faults;
        match fault {
            Fault::SlowDown => faults.slow_down += 1,
            Fault::InternalError => faults.internal_error += 1,
            Fault::ResetBeforeForwarding => faults.reset_before_forwarding += 1,
            Fault::ResetMidBody => faults.reset_mid_body += 1,
        }
    }

    pub fn failed(&self, method: Method) {
        let mut stats = self.stats.lock().unwrap();
        stats.total.failed += 1;
        stats.methods[method.index()].failed += 1;
    }

    pub fn request_body_bytes(&self, bytes: u64) {
        self.stats.lock().unwrap().request_body_bytes += bytes;
    }

    pub fn response_body_bytes(&self, bytes: u64) {
        self.stats.lock().unwrap().response_body_bytes += bytes;
    }

    pub fn connection_accepted(&self) {
        self.stats.lock().unwrap().connections_accepted += 1;
    }

    pub fn connection_refused(&self) {
        self.stats.lock().unwrap().connections_refused += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_as_json_with_escaped_paths() {
        let recorder = Recorder::default();
        recorder.request_received(Method::Get, "/bucket/a\"b");
        recorder.request_received(Method::Get, "/bucket/a\"b");
        recorder.forwarded(Method::Get);
        recorder.faulted(Method::Get, Fault::SlowDown);
        recorder.request_received(Method::Put, "/bucket/c");
        recorder.failed(Method::Put);
        recorder.response_body_bytes(10);
        let stats = recorder.snapshot();
        assert_eq!(stats.gets_of("/bucket/a\"b"), 2);
        assert_eq!(stats.gets_of("/bucket/c"), 0);
        assert_eq!(
            stats.method(Method::Get),
            RequestCounts {
                requests: 2,
                forwarded: 1,
                faulted: 1,
                failed: 0
            }
        );
        let json = stats.to_json();
        assert!(
            json.contains("\"get_paths\":{\"/bucket/a\\\"b\":2}"),
            "{json}"
        );
        assert!(
            json.contains("\"total\":{\"requests\":3,\"forwarded\":1,\"faulted\":1,\"failed\":1}")
        );
        assert!(
            json.contains("\"PUT\":{\"requests\":1,\"forwarded\":0,\"faulted\":0,\"failed\":1}")
        );
        assert!(json.contains("\"slow_down\":1"));
        assert!(json.contains("\"response_body_bytes\":10"));

        recorder.reset();
        assert_eq!(recorder.snapshot(), Stats::default());
    }

    #[test]
    fn control_characters_are_escaped() {
        let mut json = String::new();
        write_json_string(&mut json, "a\\b\n\u{1}");
        assert_eq!(json, "\"a\\\\b\\n\\u0001\"");
    }
}
