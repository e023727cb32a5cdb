//! Sizes and durations as people write them in flags and configuration files: `4GiB`, `512 MiB`,
//! `10MB`, `30s`, `1h 30m`. The grammar is the `bytesize` and `humantime` crates'; this module
//! adds what a setting needs on top: a plain number, a range check, and an error that names the
//! text.

use std::time::Duration;

use crate::{Error, ErrorKind, Result};

/// Bytes: a plain number, or a number (fractions allowed) with a binary unit (`KiB`, `MiB`,
/// `GiB`, `TiB`, also `Ki`...) or a decimal one (`KB`, `MB`, `GB`, `TB`, also `K`, `M`...), any
/// case, with or without a space: `4GiB` is 4 × 2³⁰, `10MB` is 10⁷.
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let size: bytesize::ByteSize = text.parse().map_err(|_| {
        invalid(format!(
            "size {text:?} is not a number of bytes with an optional unit such as 64KiB, 512MiB, 4GiB, 10MB"
        ))
    })?;
    // The crate saturates a value that does not fit in 64 bits.
    if size.as_u64() == u64::MAX {
        return Err(invalid(format!("size {text:?} is out of range")));
    }
    Ok(size.as_u64())
}

/// A duration in humantime's units (`500ms`, `30s`, `5m`, `2h`, `1h 30m`, `7days`), or a plain
/// number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let duration = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text).map_err(|error| {
            invalid(format!(
                "{text:?} is not a duration such as 500ms, 30s, 5m, 2h: {error}"
            ))
        })?,
    };
    if duration > Duration::from_secs(1_000_000_000) {
        return Err(invalid(format!("duration {text:?} is out of range")));
    }
    Ok(duration)
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size(" 2tib ").unwrap(), 2 << 40);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert_eq!(parse_size("3M").unwrap(), 3_000_000);
        assert_eq!(parse_size("7B").unwrap(), 7);
        for bad in [
            "",
            "MiB",
            "12XB",
            "-1",
            "1e3",
            "99999999999999999999GiB",
            "1 GiB extra",
        ] {
            let error = parse_size(bad).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{bad:?}");
            assert!(error.to_string().contains("size"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1 fortnight").is_err());
        assert!(parse_duration("99999999999h").is_err());
    }
}
