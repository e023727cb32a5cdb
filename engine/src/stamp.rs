//! What a version says of itself beside its bytes: when it was written, and the MD5 tag an S3
//! client knows it by (the MD5 of the bytes, or of the parts' MD5s for a multipart upload).
//! Both are kept in the version's entry headers and in the index, so that GET, HEAD and LIST
//! answer them without reading data, and they survive restarts and reclaim.

use std::time::{SystemTime, UNIX_EPOCH};

/// Bytes an MD5 tag takes in an entry header: the digest, then the part count.
pub const MD5_TAG_BYTES: usize = 18;

/// S3's ETag of an object: the MD5 of its bytes (`parts == 0`), or, for an object assembled
/// from `parts` uploaded parts, the MD5 of the parts' MD5 digests, written `HEX-PARTS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Md5Tag {
    pub digest: [u8; 16],
    pub parts: u16,
}

impl Md5Tag {
    /// The tag of an object stored whole.
    pub fn whole(digest: [u8; 16]) -> Md5Tag {
        Md5Tag { digest, parts: 0 }
    }

    /// The tag as an entry header holds it (`MD5_TAG_BYTES`).
    pub fn encode(&self) -> [u8; MD5_TAG_BYTES] {
        let mut bytes = [0u8; MD5_TAG_BYTES];
        bytes[..16].copy_from_slice(&self.digest);
        bytes[16..].copy_from_slice(&self.parts.to_le_bytes());
        bytes
    }

    /// The tag in `bytes` as `encode` wrote it; `None` for any other length.
    pub fn decode(bytes: &[u8]) -> Option<Md5Tag> {
        if bytes.len() != MD5_TAG_BYTES {
            return None;
        }
        Some(Md5Tag {
            digest: bytes[..16].try_into().expect("16 bytes"),
            parts: u16::from_le_bytes([bytes[16], bytes[17]]),
        })
    }

    /// The tag in S3's text form, without quotes (`HEX` or `HEX-PARTS`); `None` for any other
    /// text (an origin's ETag that is not an MD5, as GCS's and Azure's are not).
    pub fn parse(text: &str) -> Option<Md5Tag> {
        let text = text.trim_matches('"');
        let (hex, parts) = match text.split_once('-') {
            Some((hex, parts)) => {
                let parts: u16 = parts.parse().ok()?;
                if parts == 0 || parts.to_string().len() != text.len() - hex.len() - 1 {
                    return None;
                }
                (hex, parts)
            }
            None => (text, 0),
        };
        if hex.len() != 32 {
            return None;
        }
        let mut digest = [0u8; 16];
        for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Md5Tag { digest, parts })
    }
}

impl std::fmt::Display for Md5Tag {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for byte in self.digest {
            write!(out, "{byte:02x}")?;
        }
        if self.parts != 0 {
            write!(out, "-{}", self.parts)?;
        }
        Ok(())
    }
}

/// When a version was written and, where the writer computed one, its MD5 tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// Milliseconds since the Unix epoch; 0 where not known (a store written by a build that
    /// kept no times).
    pub modified_ms: u64,
    pub md5: Option<Md5Tag>,
}

impl Stamp {
    /// A version written now, without an MD5 tag.
    pub fn now() -> Stamp {
        Stamp {
            modified_ms: now_ms(),
            md5: None,
        }
    }

    /// A version written now, with `md5` (if any).
    pub fn now_with(md5: Option<Md5Tag>) -> Stamp {
        Stamp {
            modified_ms: now_ms(),
            md5,
        }
    }

    /// The time as a `SystemTime`, `None` where not known.
    pub fn modified(&self) -> Option<SystemTime> {
        (self.modified_ms != 0)
            .then(|| UNIX_EPOCH + std::time::Duration::from_millis(self.modified_ms))
    }
}

/// Milliseconds since the Unix epoch now (1 at least: 0 means not known).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |since| (since.as_millis() as u64).max(1))
}

/// Milliseconds since the Unix epoch of `time` (0 for a time before it).
pub fn ms_of(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_in_both_forms() {
        let whole = Md5Tag::whole([0xab; 16]);
        assert_eq!(whole.to_string(), "ab".repeat(16));
        assert_eq!(Md5Tag::parse(&format!("\"{whole}\"")), Some(whole));
        assert_eq!(Md5Tag::decode(&whole.encode()), Some(whole));
        let parts = Md5Tag {
            digest: [0x01; 16],
            parts: 12,
        };
        assert_eq!(parts.to_string(), format!("{}-12", "01".repeat(16)));
        assert_eq!(Md5Tag::parse(&parts.to_string()), Some(parts));
        assert_eq!(Md5Tag::decode(&parts.encode()), Some(parts));
    }

    #[test]
    fn other_etags_are_not_md5_tags() {
        for text in [
            "",
            "abc",
            "0x8DC2D7A1B2C3D4E",                   // Azure
            "CLjR4qPx/YQDEAE=",                    // GCS
            &format!("{}-0", "ab".repeat(16)),     // no part count 0
            &format!("{}-012", "ab".repeat(16)),   // no leading zeros
            &format!("{}-70000", "ab".repeat(16)), // more parts than S3 allows
            &format!("{}zz", "ab".repeat(15)),     // not hex
            &"ab".repeat(17),                      // too long
        ] {
            assert_eq!(Md5Tag::parse(text), None, "{text:?}");
        }
        assert_eq!(Md5Tag::decode(&[0; 17]), None);
    }
}
