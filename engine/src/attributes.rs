//! What a writer says of an object beside its bytes and wants answered with it: the headers S3
//! keeps with an object (Content-Type, Content-Encoding, Content-Disposition, Content-Language,
//! Cache-Control, Expires), user metadata (`x-amz-meta-*`), and the whole object's checksum
//! the writer sent and the S3 endpoint verified.
//!
//! They are kept in the entry header of the version's first chunk, not in the index (which
//! holds one flag bit saying there are some), so an object without them costs nothing more, and
//! one with them costs one header read when HEAD or GET answers them. A header has room for
//! them beside the longest bucket and key and the default geometry's checksums
//! (`ATTRIBUTES_BYTES_MAX`); with smaller checksum pieces a long key leaves less, and a put
//! whose attributes do not fit is refused before anything is written.
//!
//! Encoded as a version byte, then items of a tag byte, (for user metadata and the checksum) a
//! name of at most 255 bytes after its length byte, and a value after its little-endian u16
//! length. A build that does not know a tag refuses the encoding (the checksum's tag is newer
//! than the others: an older build answers such a version's attributes as damaged).

use crate::{Error, ErrorKind, Result};

/// Bytes the encoded attributes of one object take at most.
pub const ATTRIBUTES_BYTES_MAX: usize = 2560;

/// Bytes of user metadata at most, names and values together (S3's limit).
pub const METADATA_BYTES_MAX: usize = 2048;

const ENCODING_VERSION: u8 = 1;
const TAG_CONTENT_TYPE: u8 = 1;
const TAG_CONTENT_ENCODING: u8 = 2;
const TAG_CONTENT_DISPOSITION: u8 = 3;
const TAG_CONTENT_LANGUAGE: u8 = 4;
const TAG_CACHE_CONTROL: u8 = 5;
const TAG_EXPIRES: u8 = 6;
const TAG_CHECKSUM: u8 = 7;

/// The checksum algorithms an object's checksum may be of, as S3 names them.
pub const CHECKSUM_ALGORITHMS: [&str; 5] = ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"];
const TAG_METADATA: u8 = 16;

/// An object's attributes; the default is none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    /// As the writer sent it (an HTTP date).
    pub expires: Option<String>,
    /// User metadata: names (without `x-amz-meta-`, lowercase) and values, sorted by name.
    pub metadata: Vec<(String, String)>,
    /// The whole object's checksum as its writer sent it and the S3 endpoint verified it: the
    /// algorithm as S3 names it (`CRC32`, `CRC32C`, `CRC64NVME`, `SHA1`, `SHA256`) and the
    /// value as S3 writes it (base64).
    pub checksum: Option<(String, String)>,
}

impl Attributes {
    pub fn is_empty(&self) -> bool {
        *self == Attributes::default()
    }

    /// Whether the checksum's value is still to be read from the version's last chunk header
    /// (`checksum` names its algorithm with an empty value): a first chunk's header says so of
    /// a checksum that came after the body. Never so in attributes a store answers.
    pub fn checksum_pending(&self) -> bool {
        matches!(&self.checksum, Some((_, value)) if value.is_empty())
    }

    fn fields(&self) -> [(u8, &Option<String>); 6] {
        [
            (TAG_CONTENT_TYPE, &self.content_type),
            (TAG_CONTENT_ENCODING, &self.content_encoding),
            (TAG_CONTENT_DISPOSITION, &self.content_disposition),
            (TAG_CONTENT_LANGUAGE, &self.content_language),
            (TAG_CACHE_CONTROL, &self.cache_control),
            (TAG_EXPIRES, &self.expires),
        ]
    }

    /// The bytes an entry header keeps (empty for none); ATTRIBUTES_TOO_LARGE when user metadata is over
    /// `METADATA_BYTES_MAX`, a name over 255 bytes, or the whole over `ATTRIBUTES_BYTES_MAX`.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        let metadata_bytes: usize = self
            .metadata
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum();
        if metadata_bytes > METADATA_BYTES_MAX {
            return Err(too_large(format!(
                "user metadata is at most {METADATA_BYTES_MAX} bytes, names and values together; this is {metadata_bytes}"
            )));
        }
        let mut out = vec![ENCODING_VERSION];
        let value = |out: &mut Vec<u8>, value: &str| -> Result<()> {
            let len = u16::try_from(value.len())
                .ok()
                .filter(|len| usize::from(*len) <= ATTRIBUTES_BYTES_MAX)
                .ok_or_else(|| too_large(format!("a header value of {} bytes", value.len())))?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(value.as_bytes());
            Ok(())
        };
        for (tag, field) in self.fields() {
            if let Some(text) = field {
                out.push(tag);
                value(&mut out, text)?;
            }
        }
        let named = self
            .metadata
            .iter()
            .map(|item| (TAG_METADATA, item))
            .chain(self.checksum.iter().map(|item| (TAG_CHECKSUM, item)));
        for (tag, (name, text)) in named {
            let name_len = u8::try_from(name.len()).map_err(|_| {
                too_large(format!(
                    "a metadata name is at most 255 bytes; {} has {}",
                    name.chars().take(40).collect::<String>(),
                    name.len()
                ))
            })?;
            out.push(tag);
            out.push(name_len);
            out.extend_from_slice(name.as_bytes());
            value(&mut out, text)?;
        }
        if out.len() > ATTRIBUTES_BYTES_MAX {
            return Err(too_large(format!(
                "an object's headers and metadata take at most {ATTRIBUTES_BYTES_MAX} bytes; these take {}",
                out.len()
            )));
        }
        Ok(out)
    }

    /// The attributes `encode` wrote in `bytes` (none for no bytes); `None` when they are not
    /// such an encoding.
    pub fn decode(bytes: &[u8]) -> Option<Attributes> {
        let mut attributes = Attributes::default();
        let Some((&version, mut rest)) = bytes.split_first() else {
            return Some(attributes);
        };
        if version != ENCODING_VERSION {
            return None;
        }
        fn take<'a>(rest: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
            let (taken, after) = (rest.len() >= len).then(|| rest.split_at(len))?;
            *rest = after;
            Some(taken)
        }
        fn text(rest: &mut &[u8]) -> Option<String> {
            let len = take(rest, 2)?;
            let len = u16::from_le_bytes([len[0], len[1]]) as usize;
            String::from_utf8(take(rest, len)?.to_vec()).ok()
        }
        while let Some(&tag) = rest.first() {
            rest = &rest[1..];
            let field = match tag {
                TAG_CONTENT_TYPE => &mut attributes.content_type,
                TAG_CONTENT_ENCODING => &mut attributes.content_encoding,
                TAG_CONTENT_DISPOSITION => &mut attributes.content_disposition,
                TAG_CONTENT_LANGUAGE => &mut attributes.content_language,
                TAG_CACHE_CONTROL => &mut attributes.cache_control,
                TAG_EXPIRES => &mut attributes.expires,
                TAG_METADATA | TAG_CHECKSUM => {
                    let name_len = *take(&mut rest, 1)?.first()? as usize;
                    let name = String::from_utf8(take(&mut rest, name_len)?.to_vec()).ok()?;
                    let value = text(&mut rest)?;
                    if tag == TAG_METADATA {
                        attributes.metadata.push((name, value));
                    } else {
                        // One, of an algorithm S3 defines, in base64 (then `-` and a count of
                        // parts, for an assembled upload's): else damage, not an answer to send.
                        let base64 = |text: &str| {
                            !text.is_empty()
                                && text.bytes().all(|byte| {
                                    byte.is_ascii_alphanumeric() || b"+/=".contains(&byte)
                                })
                        };
                        let (sum, parts) = value.split_once('-').unwrap_or((&value, "1"));
                        // Empty: the value is in the version's last chunk header (a checksum
                        // that came in a trailer after the first chunk was written).
                        let pending = value.is_empty();
                        if attributes.checksum.is_some()
                            || !CHECKSUM_ALGORITHMS.contains(&name.as_str())
                            || !(pending || base64(sum))
                            || !parts.bytes().all(|byte| byte.is_ascii_digit())
                            || !(1..=10_000u32).contains(&parts.parse().unwrap_or(0))
                        {
                            return None;
                        }
                        attributes.checksum = Some((name, value));
                    }
                    continue;
                }
                _ => return None,
            };
            *field = Some(text(&mut rest)?);
        }
        Some(attributes)
    }
}

fn too_large(message: String) -> Error {
    Error::new(ErrorKind::AttributesTooLarge, message)
}

/// Bytes of decoded attributes one shard keeps of versions it read them for
/// (`AttributesCache`).
pub const ATTRIBUTES_CACHED_BYTES_MAX: usize = 8 << 20;

/// Decoded attributes of versions read recently, by the version's seq, so that GET and HEAD of
/// an object with attributes read its header block once, not at every request (its bytes may
/// be in the DRAM tier). A seq names one version of one key of the shard, so an entry is never
/// wrong for the seq it names: one of a replaced version is not asked for again and ages out.
/// First in, first out within `ATTRIBUTES_CACHED_BYTES_MAX`.
#[derive(Default)]
pub(crate) struct AttributesCache {
    by_seq: std::collections::HashMap<u64, std::rc::Rc<Attributes>>,
    order: std::collections::VecDeque<(u64, usize)>,
    bytes: usize,
}

impl AttributesCache {
    /// What one entry is counted as: its strings and the map's and queue's share.
    fn cost(attributes: &Attributes) -> usize {
        let strings: usize = attributes
            .fields()
            .iter()
            .filter_map(|(_, field)| field.as_ref().map(String::len))
            .sum::<usize>()
            + attributes
                .metadata
                .iter()
                .chain(&attributes.checksum)
                .map(|(name, value)| name.len() + value.len() + 48)
                .sum::<usize>();
        strings + std::mem::size_of::<Attributes>() + 64
    }

    pub(crate) fn get(&self, seq: u64) -> Option<std::rc::Rc<Attributes>> {
        self.by_seq.get(&seq).cloned()
    }

    pub(crate) fn insert(&mut self, seq: u64, attributes: std::rc::Rc<Attributes>) {
        let cost = Self::cost(&attributes);
        if cost > ATTRIBUTES_CACHED_BYTES_MAX || self.by_seq.contains_key(&seq) {
            return;
        }
        while self.bytes + cost > ATTRIBUTES_CACHED_BYTES_MAX {
            let Some((oldest, oldest_cost)) = self.order.pop_front() else {
                break;
            };
            self.by_seq.remove(&oldest);
            self.bytes -= oldest_cost;
        }
        self.by_seq.insert(seq, attributes);
        self.order.push_back((seq, cost));
        self.bytes += cost;
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Attributes {
        Attributes {
            content_type: Some("application/x-tar".into()),
            content_encoding: None,
            content_disposition: Some("attachment; filename=\"a.tar\"".into()),
            content_language: Some("en".into()),
            cache_control: Some("max-age=60".into()),
            expires: Some("Wed, 21 Oct 2026 07:28:00 GMT".into()),
            metadata: vec![
                ("epoch".into(), "3".into()),
                ("written-by".into(), "rank 0 ünïcode".into()),
            ],
            checksum: Some(("CRC32C".into(), "yZRlqg==".into())),
        }
    }

    #[test]
    fn round_trip_and_none_is_nothing() {
        let attributes = sample();
        let bytes = attributes.encode().unwrap();
        assert_eq!(Attributes::decode(&bytes), Some(attributes));
        assert!(Attributes::default().encode().unwrap().is_empty());
        assert_eq!(Attributes::decode(&[]), Some(Attributes::default()));
    }

    #[test]
    fn damaged_encodings_are_refused_and_truncated_ones_never_read_whole() {
        let bytes = sample().encode().unwrap();
        for cut in 1..bytes.len() {
            let decoded = Attributes::decode(&bytes[..cut]);
            assert_ne!(decoded, Some(sample()), "cut at {cut}");
        }
        let mut unknown = bytes.clone();
        unknown[1] = 99;
        assert_eq!(Attributes::decode(&unknown), None);
        let mut version = bytes;
        version[0] = 2;
        assert_eq!(Attributes::decode(&version), None);
        // A checksum of an algorithm S3 does not define, not in base64, or given twice.
        for checksum in [
            ("MD5", "yZRlqg=="),
            ("CRC32C", "yZ\r\nlqg=="),
            ("CRC32C", "-"),
            ("CRC32C", "-2"),
            ("CRC32C", "yZRlqg==-"),
            ("CRC32C", "yZRlqg==-x"),
            ("CRC32C", "yZRlqg==-0"),
            ("CRC32C", "yZRlqg==-10001"),
        ] {
            let odd = Attributes {
                checksum: Some((checksum.0.into(), checksum.1.into())),
                ..Default::default()
            };
            assert_eq!(
                Attributes::decode(&odd.encode().unwrap()),
                None,
                "{checksum:?}"
            );
        }
        let once = Attributes {
            checksum: Some(("CRC32".into(), "AAAAAA==".into())),
            ..Default::default()
        };
        let mut twice = once.encode().unwrap();
        twice.extend_from_slice(&once.encode().unwrap()[1..]);
        assert_eq!(Attributes::decode(&twice), None);
        let composite = Attributes {
            checksum: Some(("SHA256".into(), "x+/=-12".into())),
            ..Default::default()
        };
        let bytes = composite.encode().unwrap();
        assert_eq!(Attributes::decode(&bytes), Some(composite));
        let pending = Attributes {
            checksum: Some(("CRC32C".into(), String::new())),
            ..Default::default()
        };
        assert!(pending.checksum_pending());
        assert_eq!(
            Attributes::decode(&pending.encode().unwrap()),
            Some(pending)
        );
    }

    #[test]
    fn the_cache_keeps_the_newest_within_its_bound() {
        let mut cache = AttributesCache::default();
        let one = std::rc::Rc::new(sample());
        let cost = AttributesCache::cost(&one);
        let fit = ATTRIBUTES_CACHED_BYTES_MAX / cost;
        for seq in 0..(fit as u64 + 10) {
            cache.insert(seq, one.clone());
            assert!(cache.bytes() <= ATTRIBUTES_CACHED_BYTES_MAX);
        }
        assert!(cache.get(0).is_none(), "the oldest went first");
        assert_eq!(cache.get(fit as u64 + 9).as_deref(), Some(&sample()));
        assert_eq!(cache.by_seq.len(), cache.order.len());
    }

    #[test]
    fn limits_are_enforced() {
        let mut big = Attributes::default();
        big.metadata
            .push(("k".into(), "v".repeat(METADATA_BYTES_MAX)));
        assert_eq!(
            big.encode().unwrap_err().kind(),
            ErrorKind::AttributesTooLarge
        );
        big.metadata[0].1.pop();
        assert!(big.encode().is_ok());
        let long_name = Attributes {
            metadata: vec![("n".repeat(256), String::new())],
            ..Default::default()
        };
        assert_eq!(
            long_name.encode().unwrap_err().kind(),
            ErrorKind::AttributesTooLarge
        );
        let too_much = Attributes {
            content_type: Some("t".repeat(ATTRIBUTES_BYTES_MAX)),
            ..Default::default()
        };
        assert_eq!(
            too_much.encode().unwrap_err().kind(),
            ErrorKind::AttributesTooLarge
        );
    }
}
