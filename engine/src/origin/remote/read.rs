//! Reads from the origin: a range or an object's start, a HEAD, and a listing.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, GetResultPayload, ObjectStore};

use super::errors::{names_nothing, origin_error};
use super::{Condition, Fetch, OriginVersion};
use crate::origin::{Origins, Route};
use crate::{Error, ErrorKind, Result};

/// Read `range` (or, with `None`, the object from its start, at most `first_bytes_max` bytes:
/// the rest of the stream is dropped) under `condition`.
pub(crate) async fn fetch(
    counters: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
    range: Option<Range<u64>>,
    first_bytes_max: u64,
    condition: Condition,
) -> Result<Fetch> {
    let counters = &counters.counters;
    counters.gets.fetch_add(1, Ordering::Relaxed);
    let mut options = GetOptions {
        range: range.clone().map(GetRange::Bounded),
        ..GetOptions::default()
    };
    match condition {
        Condition::None => {}
        Condition::IfMatch(etag) => options.if_match = Some(etag),
        Condition::IfNoneMatch(etag) => options.if_none_match = Some(etag),
    }
    let result = match route.store.get_opts(&path, options).await {
        Ok(result) => result,
        Err(object_store::Error::NotFound { .. }) => return Ok(Fetch::NotFound),
        Err(object_store::Error::NotModified { .. }) => return Ok(Fetch::NotModified),
        Err(object_store::Error::Precondition { .. }) => return Ok(Fetch::Changed),
        Err(error) if names_nothing(&error) => return Ok(Fetch::NotFound),
        Err(error) => return Err(origin_error(counters, &route, "read", error)),
    };
    let version = OriginVersion {
        bytes: result.meta.size,
        etag: result.meta.e_tag.clone(),
        modified_ms: crate::stamp::ms_of(result.meta.last_modified.into()),
        attributes: Arc::new(attributes_from_origin(&result.attributes)),
    };
    let start = result.range.start;
    let wanted = if range.is_some() {
        result.range.end - result.range.start
    } else {
        version.bytes.min(first_bytes_max)
    };
    let data = match result.payload {
        // A folder origin's file: read in one blocking call. Its stream would read 8 KiB per
        // blocking task, and the blocking pool grows a thread whenever a task arrives before
        // the last one's thread is idle again (a 20 GiB read-through grew it past 200 threads).
        GetResultPayload::File(file, file_path) => read_file_range(file, start, wanted)
            .await
            .map_err(|error| {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                Error::new(
                    ErrorKind::OriginUnavailable,
                    format!(
                        "origin {} could not read {}: {error}",
                        route.url,
                        file_path.display()
                    ),
                )
            })?,
        GetResultPayload::Stream(mut stream) => {
            let mut data = Vec::with_capacity(wanted as usize);
            while (data.len() as u64) < wanted {
                match stream.next().await {
                    Some(Ok(piece)) => {
                        let room = wanted as usize - data.len();
                        data.extend_from_slice(&piece[..piece.len().min(room)]);
                    }
                    Some(Err(error)) => return Err(origin_error(counters, &route, "read", error)),
                    None => break,
                }
            }
            data
        }
    };
    if (data.len() as u64) < wanted {
        counters.errors.fetch_add(1, Ordering::Relaxed);
        return Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!(
                "origin {} ended {path} after {} of {wanted} bytes",
                route.url,
                data.len()
            ),
        ));
    }
    counters
        .bytes_in
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    Ok(Fetch::Data {
        version,
        start,
        data: Bytes::from(data),
    })
}

/// Up to `wanted` bytes of `file` from offset `start`, read on the origin pool's blocking
/// threads in one task (fewer when the file ends sooner: the caller reports a short read).
async fn read_file_range(file: std::fs::File, start: u64, wanted: u64) -> std::io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = file;
        file.seek(SeekFrom::Start(start))?;
        let mut data = Vec::with_capacity(wanted as usize);
        file.take(wanted).read_to_end(&mut data)?;
        Ok(data)
    })
    .await
    .unwrap_or_else(|error| Err(std::io::Error::other(error)))
}

pub(crate) async fn head(
    origins: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
) -> Result<Option<OriginVersion>> {
    origins.counters.heads.fetch_add(1, Ordering::Relaxed);
    // A GET without its body: a HEAD that also says the object's attributes.
    let options = GetOptions {
        head: true,
        ..Default::default()
    };
    match route.store.get_opts(&path, options).await {
        Ok(result) => Ok(Some(OriginVersion {
            bytes: result.meta.size,
            etag: result.meta.e_tag,
            modified_ms: crate::stamp::ms_of(result.meta.last_modified.into()),
            attributes: Arc::new(attributes_from_origin(&result.attributes)),
        })),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(error) if names_nothing(&error) => Ok(None),
        Err(error) => Err(origin_error(
            &origins.counters,
            &route,
            "answer HEAD",
            error,
        )),
    }
}

/// What an origin's answer says of an object beside its bytes, as the engine keeps it (none
/// when they would not fit: the bytes matter more).
fn attributes_from_origin(kept: &object_store::Attributes) -> crate::Attributes {
    use object_store::Attribute;
    let mut attributes = crate::Attributes::default();
    for (attribute, value) in kept {
        let value = value.to_string();
        match attribute {
            Attribute::ContentType => attributes.content_type = Some(value),
            Attribute::ContentEncoding => attributes.content_encoding = Some(value),
            Attribute::ContentDisposition => attributes.content_disposition = Some(value),
            Attribute::ContentLanguage => attributes.content_language = Some(value),
            Attribute::CacheControl => attributes.cache_control = Some(value),
            Attribute::Metadata(name) => {
                attributes.metadata.push((name.to_ascii_lowercase(), value))
            }
            _ => {}
        }
    }
    attributes.metadata.sort();
    if attributes.encode().is_err() {
        return crate::Attributes::default();
    }
    attributes
}

/// Up to `limit` objects under `prefix` after the key `start_after`, as (key, version), in key
/// order.
pub(crate) async fn list(
    origins: Arc<Origins>,
    route: Arc<Route>,
    prefix: String,
    start_after: Option<String>,
    limit: usize,
) -> Result<Vec<(String, OriginVersion)>> {
    origins.counters.lists.fetch_add(1, Ordering::Relaxed);
    // object_store lists by whole path segments; list the segment-aligned parent and filter
    // on the key prefix.
    let parent = prefix.rfind('/').map(|slash| &prefix[..slash]);
    // Paths as objects are named (`Path::parse`), so that listing and naming agree.
    let parent_path = match parent {
        Some(parent) => Some(route.path(parent)?),
        None => route.prefix.clone(),
    };
    let offset = start_after
        .as_deref()
        .map(|after| route.path(after))
        .transpose()?;
    let mut stream = match offset {
        Some(offset) => route.store.list_with_offset(parent_path.as_ref(), &offset),
        None => route.store.list(parent_path.as_ref()),
    };
    let mut found = Vec::new();
    while let Some(item) = stream.next().await {
        let meta = item.map_err(|error| origin_error(&origins.counters, &route, "list", error))?;
        let Some(key) = route.key_of(&meta.location) else {
            continue;
        };
        if key.starts_with(&prefix) && start_after.as_ref().is_none_or(|after| &key > after) {
            let version = OriginVersion {
                bytes: meta.size,
                etag: meta.e_tag,
                modified_ms: crate::stamp::ms_of(meta.last_modified.into()),
                attributes: Default::default(),
            };
            found.push((key, version));
        } else if route.listing_sorted
            && key.as_str() > prefix.as_str()
            && !key.starts_with(&prefix)
        {
            break; // past the prefix in key order
        }
        if found.len() >= limit && route.listing_sorted {
            break;
        }
        if found.len() >= LIST_GATHER_MAX {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "origin {} lists more than {LIST_GATHER_MAX} objects under {prefix:?} in no order; list narrower prefixes",
                    route.url
                ),
            ));
        }
    }
    // Not every store lists in key order (a local folder does not).
    found.sort_by(|left, right| left.0.cmp(&right.0));
    found.truncate(limit);
    Ok(found)
}

/// The most origin entries one LIST gathers before sorting (a store that does not list in key
/// order, a local folder, is listed whole up to this bound).
const LIST_GATHER_MAX: usize = 1_000_000;
