//! The control endpoint under `/__proxy/`, on the proxy's own listener, so a test needs only the
//! one address: statistics, resetting them, and changing settings while the proxy runs.

use crate::config::ConfigUpdate;
use crate::server::Shared;
use crate::stats::write_json_string;

/// A control answer, always JSON.
pub struct Answer {
    pub status: u16,
    pub reason: &'static str,
    pub body: String,
}

impl Answer {
    fn ok(body: String) -> Self {
        Answer {
            status: 200,
            reason: "OK",
            body,
        }
    }

    fn error(status: u16, reason: &'static str, message: &str) -> Self {
        let mut body = String::from("{\"error\":");
        write_json_string(&mut body, message);
        body.push('}');
        Answer {
            status,
            reason,
            body,
        }
    }
}

/// Answers a control request:
/// - `GET /__proxy/stats`: the counters;
/// - `POST /__proxy/reset`: zeroes the counters;
/// - `GET /__proxy/config`: the settings in force;
/// - `PUT /__proxy/config?fault_rate=0.2&delay_ms=0-0&bandwidth=0&faults=503,reset`: changes
///   the named settings and answers the settings now in force.
pub fn answer(shared: &Shared, method: &str, path: &str, query: &str) -> Answer {
    match (path, method) {
        ("/__proxy/stats", "GET") => Answer::ok(shared.stats.snapshot().to_json()),
        ("/__proxy/reset", "POST") => {
            shared.stats.reset();
            Answer::ok("{\"reset\":true}".to_string())
        }
        ("/__proxy/config", "GET") => Answer::ok(shared.settings().to_json()),
        ("/__proxy/config", "PUT") => match ConfigUpdate::from_query(query) {
            Err(error) => Answer::error(400, "Bad Request", &error.to_string()),
            Ok(update) => match shared.update_settings(&update) {
                Ok(settings) => Answer::ok(settings.to_json()),
                Err(error) => Answer::error(400, "Bad Request", &error.to_string()),
            },
        },
        ("/__proxy/stats" | "/__proxy/reset" | "/__proxy/config", _) => {
            Answer::error(405, "Method Not Allowed", "this method is not served here")
        }
        _ => Answer::error(
            404,
            "Not Found",
            "known: GET /__proxy/stats, POST /__proxy/reset, GET and PUT /__proxy/config",
        ),
    }
}
