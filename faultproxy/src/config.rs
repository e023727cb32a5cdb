//! What the proxy runs with: the settings fixed at start (`Config`) and the ones a test may change
//! while it runs (`Settings`, changed through a `ConfigUpdate`).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};

/// The longest per-request delay accepted, so that a typo cannot stall a test for hours.
pub const DELAY_MS_MAX: u64 = 600_000;

/// The delay of S3 Standard's first byte, roughly: the default, so that benchmarks through the
/// proxy see a realistic origin unless they ask otherwise.
pub const DELAY_DEFAULT: DelayRange = DelayRange {
    min_ms: 50,
    max_ms: 150,
};

/// How many client connections are served at once; more are refused so that a runaway client
/// cannot exhaust threads or descriptors.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;

/// The longest `fault_match` accepted.
pub const FAULT_MATCH_BYTES_MAX: usize = 1024;

/// The most entries a `--faults` list may have; the list is drawn from uniformly, so repeats only
/// weight a kind, and a longer list is certainly a mistake.
pub const FAULT_KINDS_MAX: usize = 16;

/// A bad flag or control parameter: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub parameter: &'static str,
    pub message: String,
}

impl ConfigError {
    fn new(parameter: &'static str, message: impl Into<String>) -> Self {
        ConfigError {
            parameter,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}: {}", self.parameter, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A per-request delay drawn uniformly from `min_ms..=max_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelayRange {
    pub min_ms: u64,
    pub max_ms: u64,
}

impl DelayRange {
    pub const NONE: DelayRange = DelayRange {
        min_ms: 0,
        max_ms: 0,
    };

    /// Parses `MIN-MAX` or a single `MS`, both in milliseconds; `0` and `0-0` mean no delay.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        const PARAMETER: &str = "delay_ms";
        let parse_bound = |bound: &str| {
            bound.trim().parse::<u64>().map_err(|_| {
                ConfigError::new(
                    PARAMETER,
                    format!("{text:?} is not MIN-MAX in milliseconds"),
                )
            })
        };
        let (min_ms, max_ms) = match text.split_once('-') {
            Some((min, max)) => (parse_bound(min)?, parse_bound(max)?),
            None => {
                let single = parse_bound(text)?;
                (single, single)
            }
        };
        if min_ms > max_ms {
            return Err(ConfigError::new(
                PARAMETER,
                format!("the minimum {min_ms} exceeds the maximum {max_ms}"),
            ));
        }
        if max_ms > DELAY_MS_MAX {
            return Err(ConfigError::new(
                PARAMETER,
                format!("{max_ms} ms exceeds the limit of {DELAY_MS_MAX} ms"),
            ));
        }
        Ok(DelayRange { min_ms, max_ms })
    }

    pub fn is_none(&self) -> bool {
        self.max_ms == 0
    }
}

impl fmt::Display for DelayRange {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}-{}", self.min_ms, self.max_ms)
    }
}

/// A kind of fault the proxy may inject, as listed in `--faults`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// `503 SlowDown`, answered without forwarding, as S3 throttles.
    SlowDown,
    /// `500 InternalError`, answered without forwarding.
    InternalError,
    /// A connection reset, before forwarding or in the middle of the response body, chosen by a
    /// coin flip for each fault.
    Reset,
    /// A connection reset before the request is forwarded.
    ResetBeforeForwarding,
    /// A connection reset after the request was forwarded and part of the response body relayed;
    /// the upstream server did act on the request.
    ResetMidBody,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::SlowDown,
        FaultKind::InternalError,
        FaultKind::Reset,
        FaultKind::ResetBeforeForwarding,
        FaultKind::ResetMidBody,
    ];

    /// The name used in flags, control parameters and statistics.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::SlowDown => "503",
            FaultKind::InternalError => "500",
            FaultKind::Reset => "reset",
            FaultKind::ResetBeforeForwarding => "reset-before",
            FaultKind::ResetMidBody => "reset-mid-body",
        }
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let text = text.trim();
        FaultKind::ALL
            .into_iter()
            .find(|kind| kind.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.name()).collect();
                ConfigError::new("faults", format!("{text:?} is not one of {names:?}"))
            })
    }
}

/// Parses a comma-separated list of fault kinds, such as `503,500,reset`.
pub fn parse_faults(text: &str) -> Result<Vec<FaultKind>, ConfigError> {
    let kinds = text
        .split(',')
        .map(FaultKind::parse)
        .collect::<Result<Vec<_>, _>>()?;
    validate_faults(&kinds)?;
    Ok(kinds)
}

fn validate_faults(kinds: &[FaultKind]) -> Result<(), ConfigError> {
    if kinds.is_empty() {
        return Err(ConfigError::new("faults", "the list is empty"));
    }
    if kinds.len() > FAULT_KINDS_MAX {
        return Err(ConfigError::new(
            "faults",
            format!(
                "{} kinds exceed the limit of {FAULT_KINDS_MAX}",
                kinds.len()
            ),
        ));
    }
    Ok(())
}

fn validate_fault_match(text: &str) -> Result<(), ConfigError> {
    if text.len() > FAULT_MATCH_BYTES_MAX {
        return Err(ConfigError::new(
            "fault_match",
            format!(
                "{} bytes exceed the limit of {FAULT_MATCH_BYTES_MAX}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// Parses a fault rate, the probability in `0..=1` that a request is faulted.
/// Parses a fault limit: a count of faults, or `none` for no limit.
pub fn parse_fault_limit(text: &str) -> Result<Option<u64>, ConfigError> {
    match text.trim() {
        "none" => Ok(None),
        count => count.parse().map(Some).map_err(|_| {
            ConfigError::new(
                "fault_limit",
                format!("{text:?} is neither a count nor \"none\""),
            )
        }),
    }
}

pub fn parse_fault_rate(text: &str) -> Result<f64, ConfigError> {
    let rate: f64 = text
        .trim()
        .parse()
        .map_err(|_| ConfigError::new("fault_rate", format!("{text:?} is not a number")))?;
    validate_fault_rate(rate)?;
    Ok(rate)
}

fn validate_fault_rate(rate: f64) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(ConfigError::new(
            "fault_rate",
            format!("{rate} is not between 0 and 1"),
        ));
    }
    Ok(())
}

/// Parses a bandwidth in bytes per second: a number, or one with a unit as the `bytesize` crate
/// reads them (decimal `KB`/`MB`/`GB`, also `K`/`M`/`G`, or binary `KiB`/`MiB`/`GiB`, any case).
/// `0` means unlimited.
pub fn parse_bandwidth(text: &str) -> Result<u64, ConfigError> {
    let invalid = || {
        ConfigError::new(
            "bandwidth",
            format!("{text:?} is not bytes per second such as 10MiB"),
        )
    };
    let size: bytesize::ByteSize = text.trim().parse().map_err(|_| invalid())?;
    // The crate saturates a value that does not fit in 64 bits.
    match size.as_u64() {
        u64::MAX => Err(invalid()),
        bytes => Ok(bytes),
    }
}

/// The settings that may change while the proxy runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Slept before each request is forwarded or faulted. Default: 50-150 ms.
    pub delay: DelayRange,
    /// Shared by all connections and both directions of body bytes; 0 is unlimited. Default: 0.
    pub bandwidth_bytes_per_second: u64,
    /// The probability that a request is faulted. Default: 0.
    pub fault_rate: f64,
    /// The kinds a fault is drawn from, uniformly. Default: 503, 500 and reset.
    pub faults: Vec<FaultKind>,
    /// Only requests whose `METHOD TARGET` (such as `POST /bucket/key?uploadId=...`) contains
    /// this text may be faulted; empty: any request. Default: empty.
    pub fault_match: String,
    /// How many more faults may be injected; `None` is no limit. Each injected fault lowers it,
    /// so that a test can ask for exactly N faults. Default: no limit.
    pub faults_left: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            delay: DELAY_DEFAULT,
            bandwidth_bytes_per_second: 0,
            fault_rate: 0.0,
            faults: vec![
                FaultKind::SlowDown,
                FaultKind::InternalError,
                FaultKind::Reset,
            ],
            fault_match: String::new(),
            faults_left: None,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.delay.min_ms > self.delay.max_ms || self.delay.max_ms > DELAY_MS_MAX {
            return Err(ConfigError::new(
                "delay_ms",
                format!("{} is not a valid range", self.delay),
            ));
        }
        validate_fault_rate(self.fault_rate)?;
        validate_fault_match(&self.fault_match)?;
        validate_faults(&self.faults)
    }

    pub fn to_json(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|kind| format!("\"{}\"", kind.name()))
            .collect();
        let fault_match: String = self
            .fault_match
            .chars()
            .flat_map(|character| match character {
                '"' | '\\' => vec!['\\', character],
                character if character.is_control() => vec!['?'],
                character => vec![character],
            })
            .collect();
        let faults_left = match self.faults_left {
            Some(left) => left.to_string(),
            None => "null".to_string(),
        };
        format!(
            "{{\"delay_ms\":\"{}\",\"bandwidth_bytes_per_second\":{},\"fault_rate\":{},\"faults\":[{}],\"fault_match\":\"{fault_match}\",\"faults_left\":{faults_left}}}",
            self.delay,
            self.bandwidth_bytes_per_second,
            self.fault_rate,
            faults.join(",")
        )
    }
}

/// A change to some of the settings; the fields left `None` keep their value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigUpdate {
    pub delay: Option<DelayRange>,
    pub bandwidth_bytes_per_second: Option<u64>,
    pub fault_rate: Option<f64>,
    pub faults: Option<Vec<FaultKind>>,
    pub fault_match: Option<String>,
    /// `Some(None)` lifts the limit; `Some(Some(n))` allows `n` more faults.
    pub fault_limit: Option<Option<u64>>,
}

impl ConfigUpdate {
    /// Parses a query string such as `fault_rate=0.2&delay_ms=0-0&bandwidth=10MiB&faults=503`.
    pub fn from_query(query: &str) -> Result<Self, ConfigError> {
        let mut update = ConfigUpdate::default();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)
                .ok_or_else(|| ConfigError::new("query", format!("{value:?} is badly escaped")))?;
            match key {
                "delay_ms" => update.delay = Some(DelayRange::parse(&value)?),
                "bandwidth" => update.bandwidth_bytes_per_second = Some(parse_bandwidth(&value)?),
                "fault_rate" => update.fault_rate = Some(parse_fault_rate(&value)?),
                "faults" => update.faults = Some(parse_faults(&value)?),
                "fault_match" => update.fault_match = Some(value),
                "fault_limit" => update.fault_limit = Some(parse_fault_limit(&value)?),
                _ => {
                    return Err(ConfigError::new(
                        "query",
                        format!(
                        "unknown parameter {key:?}; known: delay_ms, bandwidth, fault_rate, faults, fault_match, fault_limit"
                    ),
                    ))
                }
            }
        }
        Ok(update)
    }

    /// The settings after this update, validated.
    pub fn apply_to(&self, settings: &Settings) -> Result<Settings, ConfigError> {
        let updated = Settings {
            delay: self.delay.unwrap_or(settings.delay),
            bandwidth_bytes_per_second: self
                .bandwidth_bytes_per_second
                .unwrap_or(settings.bandwidth_bytes_per_second),
            fault_rate: self.fault_rate.unwrap_or(settings.fault_rate),
            faults: self
                .faults
                .clone()
                .unwrap_or_else(|| settings.faults.clone()),
            fault_match: self
                .fault_match
                .clone()
                .unwrap_or_else(|| settings.fault_match.clone()),
            faults_left: self.fault_limit.unwrap_or(settings.faults_left),
        };
        updated.validate()?;
        Ok(updated)
    }
}

/// Decodes `%XX` escapes and `+` (a space in query strings); `None` if an escape is malformed or
/// the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' => {
                let hex = bytes.get(index + 1..index + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                decoded.push(u8::from_str_radix(hex, 16).ok()?);
                index += 3;
            }
            b'+' => {
                decoded.push(b' ');
                index += 1;
            }
            byte => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded).ok()
}

/// Everything the proxy starts with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen; port 0 picks a free port (see `ProxyHandle::addr`). Default:
    /// 127.0.0.1:0.
    pub listen: SocketAddr,
    /// The S3-compatible server to forward to, as `HOST:PORT`; resolved at each connect.
    pub upstream: String,
    pub settings: Settings,
    /// Seeds the fault and delay draws; connection `n` (in accept order) draws from a generator
    /// seeded with `seed` and `n`, so a run with the same seed and the same order of connections
    /// repeats. Default: 0.
    pub seed: u64,
    /// Default: 1024.
    pub connections_max: usize,
}

impl Config {
    /// The defaults, forwarding to `upstream`.
    pub fn new(upstream: impl Into<String>) -> Self {
        Config {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            upstream: upstream.into(),
            settings: Settings::default(),
            seed: 0,
            connections_max: CONNECTIONS_MAX_DEFAULT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_ranges_parse_and_refuse_inverted_or_huge_bounds() {
        assert_eq!(DelayRange::parse("0").unwrap(), DelayRange::NONE);
        assert_eq!(DelayRange::parse("0-0").unwrap(), DelayRange::NONE);
        assert!(DelayRange::parse("0-0").unwrap().is_none());
        assert_eq!(
            DelayRange::parse("50-150").unwrap(),
            DelayRange {
                min_ms: 50,
                max_ms: 150
            }
        );
        assert_eq!(
            DelayRange::parse("100").unwrap(),
            DelayRange {
                min_ms: 100,
                max_ms: 100
            }
        );
        assert!(DelayRange::parse("150-50").is_err());
        assert!(DelayRange::parse("1-999999999").is_err());
        assert!(DelayRange::parse("fast").is_err());
    }

    #[test]
    fn bandwidths_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_bandwidth("0").unwrap(), 0);
        assert_eq!(parse_bandwidth("1234").unwrap(), 1234);
        assert_eq!(parse_bandwidth("10MiB").unwrap(), 10 << 20);
        assert_eq!(parse_bandwidth("10mib").unwrap(), 10 << 20);
        assert_eq!(parse_bandwidth("2 KiB").unwrap(), 2048);
        assert_eq!(parse_bandwidth("3MB").unwrap(), 3_000_000);
        assert_eq!(parse_bandwidth("3M").unwrap(), 3_000_000);
        assert_eq!(parse_bandwidth("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bandwidth("7B").unwrap(), 7);
        assert!(parse_bandwidth("MiB").is_err());
        assert_eq!(parse_bandwidth("1.5KiB").unwrap(), 1536);
        assert!(parse_bandwidth("12XB").is_err());
        assert!(parse_bandwidth("99999999999999999999GiB").is_err());
    }

    #[test]
    fn fault_lists_parse_and_refuse_unknown_kinds() {
        assert_eq!(
            parse_faults("503,500,reset").unwrap(),
            vec![
                FaultKind::SlowDown,
                FaultKind::InternalError,
                FaultKind::Reset
            ]
        );
        assert_eq!(
            parse_faults("reset-before, reset-mid-body").unwrap(),
            vec![FaultKind::ResetBeforeForwarding, FaultKind::ResetMidBody]
        );
        assert!(parse_faults("404").is_err());
        assert!(parse_faults("").is_err());
        assert!(parse_fault_rate("1.5").is_err());
        assert!(parse_fault_rate("-0.1").is_err());
        assert!(parse_fault_rate("NaN").is_err());
        assert_eq!(parse_fault_rate("0.2").unwrap(), 0.2);
    }

    #[test]
    fn updates_from_a_query_change_only_the_named_settings() {
        let settings = Settings::default();
        let update =
            ConfigUpdate::from_query("fault_rate=0.2&delay_ms=0-0&bandwidth=0&faults=503%2Creset")
                .unwrap();
        let updated = update.apply_to(&settings).unwrap();
        assert_eq!(updated.fault_rate, 0.2);
        assert_eq!(updated.delay, DelayRange::NONE);
        assert_eq!(updated.bandwidth_bytes_per_second, 0);
        assert_eq!(updated.faults, vec![FaultKind::SlowDown, FaultKind::Reset]);

        let only_rate = ConfigUpdate::from_query("fault_rate=1").unwrap();
        let updated = only_rate.apply_to(&settings).unwrap();
        assert_eq!(updated.delay, settings.delay);
        assert_eq!(updated.faults, settings.faults);

        assert!(ConfigUpdate::from_query("speed=fast").is_err());
        assert!(ConfigUpdate::from_query("fault_rate=2").is_err());
        assert!(ConfigUpdate::from_query("faults=%zz").is_err());

        let limited = ConfigUpdate::from_query("fault_limit=6")
            .unwrap()
            .apply_to(&settings)
            .unwrap();
        assert_eq!(limited.faults_left, Some(6));
        let unlimited = ConfigUpdate::from_query("fault_limit=none")
            .unwrap()
            .apply_to(&limited)
            .unwrap();
        assert_eq!(unlimited.faults_left, None);
        assert!(ConfigUpdate::from_query("fault_limit=-1").is_err());
    }

    #[test]
    fn settings_render_as_json() {
        let settings = Settings {
            delay: DelayRange::NONE,
            bandwidth_bytes_per_second: 1024,
            fault_rate: 0.5,
            faults: vec![FaultKind::SlowDown, FaultKind::Reset],
            fault_match: "POST /b/\"k\"".to_string(),
            faults_left: Some(3),
        };
        assert_eq!(
            settings.to_json(),
            "{\"delay_ms\":\"0-0\",\"bandwidth_bytes_per_second\":1024,\"fault_rate\":0.5,\"faults\":[\"503\",\"reset\"],\"fault_match\":\"POST /b/\\\"k\\\"\",\"faults_left\":3}"
        );
    }
}
