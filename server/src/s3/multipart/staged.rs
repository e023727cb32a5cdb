//! How an upload lives as staged objects: its record, its parts' keys and what a listing of
//! them says, the parts a Complete names, and the ETag of the assembled object.

use std::collections::BTreeMap;

use hydrant_engine::{Attributes, Md5Tag, ObjectKey as StoreKey, ObjectMeta};
use s3s::dto::*;
use s3s::{s3_error, S3Result};

use super::super::errors::s3_error as engine_error;
use super::{PARTS_MAX, PART_BYTES_MAX, PART_BYTES_MIN};

/// What the first line of an upload's staged record says: version 2 keeps the object's
/// attributes (hexadecimal, on the line before the key); version 1 records, of uploads begun by
/// an older build, have none.
const UPLOAD_RECORD_MAGIC: &str = "hydrant multipart upload 2";
const UPLOAD_RECORD_MAGIC_V1: &str = "hydrant multipart upload 1";

/// An upload in progress, as its staged record says.
pub(super) struct Upload {
    pub(super) bucket: String,
    pub(super) id: String,
    pub(super) key: String,
    pub(super) initiated_ms: u64,
    /// The object's attributes, as CreateMultipartUpload gave them.
    pub(super) attributes: Attributes,
}

/// One part as staged: its bytes, and its ETag once it is whole.
#[derive(Clone)]
pub(super) struct StagedPart {
    pub(super) number: u32,
    pub(super) nonce: String,
    pub(super) data: Option<ObjectMeta>,
    pub(super) md5: Option<String>,
}

impl StagedPart {
    pub(super) fn whole(&self) -> bool {
        self.data.is_some() && self.md5.is_some()
    }

    pub(super) fn bytes(&self) -> u64 {
        self.data.as_ref().map_or(0, |meta| meta.bytes)
    }
}

/// A part's number, which S3 allows from 1 to `PARTS_MAX`.
pub(super) fn part_number(number: i32) -> S3Result<u32> {
    u32::try_from(number)
        .ok()
        .filter(|number| (1..=PARTS_MAX).contains(number))
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "part numbers are 1 to {PARTS_MAX}, not {number}"
            )
        })
}

/// A part's size, at most `PART_BYTES_MAX`.
pub(super) fn check_part_bytes(bytes: u64) -> S3Result<()> {
    if bytes > PART_BYTES_MAX {
        return Err(s3_error!(
            EntityTooLarge,
            "a part is at most {PART_BYTES_MAX} bytes; this one is {bytes}"
        ));
    }
    Ok(())
}

pub(super) fn staged(key: &str) -> S3Result<StoreKey> {
    StoreKey::staged(key).map_err(engine_error)
}

pub(super) fn upload_record_key(bucket: &str, id: &str) -> String {
    format!("multipart/uploads/{bucket}/{id}")
}

pub(super) fn parts_prefix(id: &str) -> String {
    format!("multipart/parts/{id}/")
}

pub(super) fn part_key(id: &str, number: u32, nonce: &str, tag: &str) -> String {
    format!("{}{number:05}.{nonce}.{tag}", parts_prefix(id))
}

pub(super) fn no_such_upload(id: &str) -> s3s::S3Error {
    s3_error!(
        NoSuchUpload,
        "there is no upload {id} in progress for this key (completed, aborted, or never begun)"
    )
}

/// 32 hexadecimal digits: the millisecond the upload began (12) and randomness (20).
pub(super) fn new_id(now_ms: u64) -> S3Result<String> {
    let mut random = [0u8; 10];
    getrandom::fill(&mut random)
        .map_err(|error| s3_error!(InternalError, "no randomness for an upload ID: {error}"))?;
    Ok(format!(
        "{:012x}{}",
        now_ms & 0xffff_ffff_ffff,
        hex(&random)
    ))
}

/// When the upload `id` began, as its ID says, if that is a plausible time (IDs of earlier
/// builds were all randomness: their records say).
pub(super) fn begun_ms(id: &str, now_ms: u64) -> Option<u64> {
    /// 2025-01-01, before any ID of this form.
    const EARLIEST_MS: u64 = 1_735_689_600_000;
    let begun = u64::from_str_radix(id.get(..12)?, 16).ok()?;
    (EARLIEST_MS..=now_ms.saturating_add(24 * 3600 * 1000))
        .contains(&begun)
        .then_some(begun)
}

/// How often the sweep looks for expired uploads: a quarter of the expiry, within 1 s..1 h.
pub(super) fn sweep_period(expiry: std::time::Duration) -> std::time::Duration {
    (expiry / 4).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3600),
    )
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(super) fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

pub(super) fn timestamp_of_ms(ms: u64) -> Timestamp {
    Timestamp::from(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

/// Whether `text` is an MD5 as a part's ETag spells it (32 lowercase hexadecimal digits).
pub(super) fn is_md5(text: &str) -> bool {
    valid_id(text)
}

/// The parts of a listing of `multipart/parts/ID/`, by number (every nonce of each).
pub(super) fn parse_parts(listing: Vec<ObjectMeta>) -> BTreeMap<u32, Vec<StagedPart>> {
    let mut parts: BTreeMap<u32, Vec<StagedPart>> = BTreeMap::new();
    for meta in listing {
        let name = meta.key.rsplit('/').next().unwrap_or_default().to_string();
        let mut fields = name.split('.');
        let (Some(number), Some(nonce), Some(tag), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(number) = number.parse::<u32>() else {
            continue;
        };
        let versions = parts.entry(number).or_default();
        let index = match versions.iter().position(|part| part.nonce == nonce) {
            Some(index) => index,
            None => {
                versions.push(StagedPart {
                    number,
                    nonce: nonce.to_string(),
                    data: None,
                    md5: None,
                });
                versions.len() - 1
            }
        };
        if tag == "data" {
            versions[index].data = Some(meta);
        } else if is_md5(tag) {
            versions[index].md5 = Some(tag.to_string());
        }
    }
    parts
}

/// The newest whole staged version of each part (the one a listing shows).
pub(super) fn whole_parts(parts: &BTreeMap<u32, Vec<StagedPart>>) -> Vec<StagedPart> {
    parts
        .values()
        .filter_map(|versions| {
            versions
                .iter()
                .filter(|part| part.whole())
                .max_by_key(|part| part.data.as_ref().map_or(0, |meta| meta.seq))
                .cloned()
        })
        .collect()
}

/// What an ETag a client sent says, without quotes.
pub(super) fn etag_text(etag: &ETag) -> String {
    etag.value().trim_matches('"').to_ascii_lowercase()
}

/// An upload's staged record: the magic line, when it began, its object's attributes, and the
/// object's key (last: a key may hold a newline).
pub(super) fn upload_record(initiated_ms: u64, attributes: &Attributes, key: &str) -> Vec<u8> {
    let encoded = attributes.encode().unwrap_or_default();
    format!(
        "{UPLOAD_RECORD_MAGIC}\n{initiated_ms}\n{}\n{key}",
        hex(&encoded)
    )
    .into_bytes()
}

pub(super) fn parse_upload_record(bucket: &str, id: &str, record: &[u8]) -> Option<Upload> {
    let text = std::str::from_utf8(record).ok()?;
    let (magic, rest) = text.split_once('\n')?;
    let (initiated_ms, rest) = rest.split_once('\n')?;
    let (attributes, key) = match magic {
        UPLOAD_RECORD_MAGIC => {
            let (attributes, key) = rest.split_once('\n')?;
            (Attributes::decode(&unhex(attributes)?)?, key)
        }
        UPLOAD_RECORD_MAGIC_V1 => (Attributes::default(), rest),
        _ => return None,
    };
    Some(Upload {
        bucket: bucket.to_string(),
        id: id.to_string(),
        key: key.to_string(),
        initiated_ms: initiated_ms.parse().ok()?,
        attributes,
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

/// S3's ETag of an object assembled from `parts`: the MD5 of their MD5 digests, one after the
/// other, and their count (`None` if a part's MD5 is not known, which a whole part's always is).
pub(super) fn multipart_tag(parts: &[StagedPart]) -> Option<Md5Tag> {
    use s3s::crypto::Checksum as _;
    let mut md5 = s3s::crypto::Md5::new();
    for part in parts {
        let tag = Md5Tag::parse(part.md5.as_deref()?)?;
        md5.update(&tag.digest);
    }
    Some(Md5Tag {
        digest: md5.finalize(),
        parts: u16::try_from(parts.len()).ok()?,
    })
}

/// The staged parts a Complete names, in its order: each by number and ETag, in ascending
/// order, every one but the last at least `PART_BYTES_MIN`.
pub(super) fn choose_parts(
    staged: &BTreeMap<u32, Vec<StagedPart>>,
    named: &[CompletedPart],
) -> S3Result<Vec<StagedPart>> {
    if named.is_empty() {
        return Err(s3_error!(
            MalformedXML,
            "a CompleteMultipartUpload names at least one part"
        ));
    }
    if named.len() > PARTS_MAX as usize {
        return Err(s3_error!(
            MalformedXML,
            "an upload has at most {PARTS_MAX} parts"
        ));
    }
    let mut chosen: Vec<StagedPart> = Vec::with_capacity(named.len());
    for part in named {
        let number = part.part_number.unwrap_or(0);
        if chosen
            .last()
            .is_some_and(|previous| previous.number as i32 >= number)
        {
            return Err(s3_error!(
                InvalidPartOrder,
                "parts are named in ascending order of their numbers"
            ));
        }
        let wanted = part.e_tag.as_ref().map(etag_text);
        let found = u32::try_from(number)
            .ok()
            .and_then(|number| staged.get(&number))
            .and_then(|versions| {
                versions
                    .iter()
                    .find(|version| version.whole() && version.md5 == wanted)
            })
            .ok_or_else(|| {
                s3_error!(
                    InvalidPart,
                    "part {number} with ETag {} was not uploaded (or not whole)",
                    wanted.as_deref().unwrap_or("(none)")
                )
            })?;
        chosen.push(found.clone());
    }
    if let Some(small) = chosen[..chosen.len() - 1]
        .iter()
        .find(|part| part.bytes() < PART_BYTES_MIN)
    {
        return Err(s3_error!(
            EntityTooSmall,
            "part {} has {} bytes; every part but the last has at least {PART_BYTES_MIN}",
            small.number,
            small.bytes()
        ));
    }
    Ok(chosen)
}

/// A page of uploads, and the prefixes that a delimiter groups them into.
pub(super) struct ListedUploads {
    pub(super) uploads: Vec<Upload>,
    pub(super) truncated: bool,
}

pub(super) fn group_by_delimiter(
    uploads: Vec<Upload>,
    prefix: &str,
    delimiter: Option<&str>,
    max: usize,
) -> (ListedUploads, Vec<String>) {
    let mut listed = Vec::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut truncated = false;
    for upload in uploads {
        if listed.len() + prefixes.len() >= max {
            truncated = true;
            break;
        }
        let grouped = delimiter
            .filter(|delimiter| !delimiter.is_empty())
            .and_then(|delimiter| {
                upload.key[prefix.len()..]
                    .find(delimiter)
                    .map(|at| upload.key[..prefix.len() + at + delimiter.len()].to_string())
            });
        match grouped {
            Some(common) => {
                if prefixes.last() != Some(&common) {
                    prefixes.push(common);
                }
            }
            None => listed.push(upload),
        }
    }
    (
        ListedUploads {
            uploads: listed,
            truncated,
        },
        prefixes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged_meta(key: &str, bytes: u64, seq: u64) -> ObjectMeta {
        ObjectMeta {
            bucket: hydrant_engine::STAGED_BUCKET.to_string(),
            key: key.to_string(),
            bytes,
            seq,
            dirty: true,
            stamp: Default::default(),
        }
    }

    #[test]
    fn a_part_counts_once_whole_and_complete_picks_by_number_and_etag() {
        let id = "0123456789abcdef0123456789abcdef";
        let md5_a = "00112233445566778899aabbccddeeff";
        let md5_b = "ffeeddccbbaa99887766554433221100";
        let listing = vec![
            staged_meta(&part_key(id, 1, "n1", "data"), 6 << 20, 1),
            staged_meta(&part_key(id, 1, "n1", md5_a), 32, 2),
            // Part 2 sent twice: once whole, once cut off (no second key).
            staged_meta(&part_key(id, 2, "n2", "data"), 10, 3),
            staged_meta(&part_key(id, 2, "n2", md5_b), 32, 4),
            staged_meta(&part_key(id, 2, "n3", "data"), 99, 5),
        ];
        let parts = parse_parts(listing);
        let whole = whole_parts(&parts);
        assert_eq!(
            whole
                .iter()
                .map(|part| (part.number, part.bytes()))
                .collect::<Vec<_>>(),
            vec![(1, 6 << 20), (2, 10)]
        );
        let named = |number: i32, etag: &str| CompletedPart {
            part_number: Some(number),
            e_tag: Some(ETag::Strong(etag.to_string())),
            ..Default::default()
        };
        let chosen = choose_parts(&parts, &[named(1, md5_a), named(2, md5_b)]).unwrap();
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[1].nonce, "n2");
        let code = |result: S3Result<Vec<StagedPart>>| result.err().unwrap().code().clone();
        assert_eq!(
            code(choose_parts(&parts, &[named(1, md5_b)])),
            s3s::S3ErrorCode::InvalidPart
        );
        assert_eq!(
            code(choose_parts(&parts, &[named(2, md5_b), named(1, md5_a)])),
            s3s::S3ErrorCode::InvalidPartOrder
        );
        // Part 2 (10 bytes) may not come before another.
        let small_first = parse_parts(vec![
            staged_meta(&part_key(id, 1, "n1", "data"), 10, 1),
            staged_meta(&part_key(id, 1, "n1", md5_a), 32, 2),
            staged_meta(&part_key(id, 2, "n2", "data"), 10, 3),
            staged_meta(&part_key(id, 2, "n2", md5_b), 32, 4),
        ]);
        assert_eq!(
            code(choose_parts(
                &small_first,
                &[named(1, md5_a), named(2, md5_b)]
            )),
            s3s::S3ErrorCode::EntityTooSmall
        );
    }

    #[test]
    fn upload_ids_and_records_are_checked() {
        let id = new_id(now_ms()).unwrap();
        assert!(valid_id(&id));
        assert!(!valid_id("../../etc"));
        assert!(!valid_id(&id.to_uppercase()));
        let attributes = Attributes {
            content_type: Some("application/x-tar".into()),
            metadata: vec![("epoch".into(), "7".into())],
            ..Default::default()
        };
        let record = upload_record(17, &attributes, "key with\nnewline");
        let upload = parse_upload_record("b", &id, &record).unwrap();
        assert_eq!(upload.key, "key with\nnewline");
        assert_eq!(upload.initiated_ms, 17);
        assert_eq!(upload.attributes, attributes);
        // A record of an older build has no attributes.
        let older = format!("{UPLOAD_RECORD_MAGIC_V1}\n18\nkey with\nnewline");
        let upload = parse_upload_record("b", &id, older.as_bytes()).unwrap();
        assert_eq!(upload.key, "key with\nnewline");
        assert_eq!(upload.initiated_ms, 18);
        assert!(upload.attributes.is_empty());
        assert!(parse_upload_record("b", &id, b"something else\n1\nk").is_none());
        let damaged = format!("{UPLOAD_RECORD_MAGIC}\n17\nzz\nkey");
        assert!(parse_upload_record("b", &id, damaged.as_bytes()).is_none());
    }

    #[test]
    fn an_upload_id_says_when_it_began_and_random_ids_are_not_read_as_times() {
        let now = now_ms();
        let id = new_id(now).unwrap();
        assert_eq!(begun_ms(&id, now), Some(now));
        // An ID of an earlier build (all randomness) reading as the far future or the past.
        assert_eq!(begun_ms("ffffffffffff00000000000000000000", now), None);
        assert_eq!(begun_ms("00000000000100000000000000000000", now), None);
        assert_eq!(
            sweep_period(std::time::Duration::from_secs(24 * 3600)),
            std::time::Duration::from_secs(3600)
        );
        assert_eq!(
            sweep_period(std::time::Duration::from_secs(2)),
            std::time::Duration::from_secs(1)
        );
    }
}
