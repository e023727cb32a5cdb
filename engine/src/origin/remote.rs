//! The origin requests themselves: `object_store` calls that run on the origin pool, with their
//! errors turned into the engine's kinds (a missing object is an answer, not an error; anything
//! else the origin says is ORIGIN_UNAVAILABLE, which readers may retry).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, GetResultPayload, MultipartId, ObjectStore, ObjectStoreExt, PutPayload,
};

use super::{OriginConfig, OriginCounters, Route, StoreSettings};
use crate::{Error, ErrorKind, Result};

/// What the origin says an object is: its size and ETag, and when it was written there.
#[derive(Clone, Debug)]
pub struct OriginVersion {
    pub bytes: u64,
    pub etag: Option<String>,
    /// Milliseconds since the Unix epoch; 0 where the answer did not say (a write's).
    pub modified_ms: u64,
    /// What the origin keeps of the object beside its bytes (its Content-Type, user
    /// metadata...), as far as the answer said: a GET's and a HEAD's say, a listing's do not.
    pub attributes: Arc<crate::Attributes>,
}

/// Versions are the same by size and ETag; the time is what an answer said of the version,
/// not part of what it is (a write's answer does not say it, a HEAD's does).
impl PartialEq for OriginVersion {
    fn eq(&self, other: &OriginVersion) -> bool {
        self.bytes == other.bytes && self.etag == other.etag
    }
}

impl Eq for OriginVersion {}

impl OriginVersion {
    /// What a copy of this version says of itself: the origin's time (or now, where it is
    /// not known) and its ETag where that is an MD5 tag (S3's are).
    pub fn stamp(&self) -> crate::Stamp {
        crate::Stamp {
            modified_ms: if self.modified_ms != 0 {
                self.modified_ms
            } else {
                crate::stamp::now_ms()
            },
            md5: self.etag.as_deref().and_then(crate::Md5Tag::parse),
        }
    }
}

/// The answer to a read from the origin.
pub(crate) enum Fetch {
    /// `data` holds the object's bytes from offset `start`.
    Data {
        version: OriginVersion,
        start: u64,
        data: Bytes,
    },
    /// The conditional GET found the cached ETag current.
    NotModified,
    /// The object changed since the ETag the read was pinned to.
    Changed,
    NotFound,
}

impl Fetch {
    /// The bytes it holds.
    pub(crate) fn data_bytes(&self) -> u64 {
        match self {
            Fetch::Data { data, .. } => data.len() as u64,
            _ => 0,
        }
    }
}

/// How a read is tied to a version.
pub(crate) enum Condition {
    None,
    /// Only if the object is still this ETag (reads of further chunks of one version).
    IfMatch(String),
    /// Only if the object is no longer this ETag (revalidation).
    IfNoneMatch(String),
}

/// An origin URL opened: the store for reads, metadata and small PUTs; for object stores, the
/// same store with the upload time limit, for multipart uploads driven part by part; and the
/// path prefix within the container.
pub(super) struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub parts: Option<Arc<dyn MultipartStore>>,
    pub prefix: Option<Path>,
    /// For a local folder: the folder the store's paths are under.
    pub folder: Option<std::path::PathBuf>,
}

/// Open the store for an origin URL: configured by the environment's variables, with
/// `settings` over them, or by `settings` alone when they came from a settings file.
pub(super) fn open_store(
    url: &str,
    settings: &StoreSettings,
    config: &OriginConfig,
) -> Result<Opened> {
    let unavailable = |error: object_store::Error| {
        Error::new(
            ErrorKind::InvalidConfig,
            format!("cannot use origin {url}: {error}"),
        )
    };
    if let Some(path) = url.strip_prefix("file://") {
        let root = path;
        std::fs::create_dir_all(root)
            .map_err(|error| Error::io(format!("cannot create the origin folder {root}"), error))?;
        // Each write is synced (the file, then its folder) before it counts as done, as an
        // object store's acknowledgement is durable: a version is marked clean, and may then
        // leave NVMe, only once the folder holds it through a power loss.
        let store = object_store::local::LocalFileSystem::new_with_prefix(root)
            .map_err(unavailable)?
            .with_automatic_cleanup(true)
            .with_fsync(true);
        return Ok(Opened {
            store: Arc::new(store),
            parts: None,
            prefix: None,
            folder: Some(root.into()),
        });
    }
    let (scheme, rest) = url.split_once("://").expect("checked URL");
    let (container, prefix) = match rest.split_once('/') {
        Some((container, prefix)) if !prefix.trim_matches('/').is_empty() => {
            (container, Some(Path::from(prefix.trim_matches('/'))))
        }
        Some((container, _)) => (container, None),
        None => (rest, None),
    };
    let root = format!("{scheme}://{container}");
    // Reads and metadata give up after `request_timeout`; upload requests (a part, or the
    // completion, which S3 may take minutes to assemble for a large object) after
    // `upload_timeout`, so that a slow completion is waited for rather than abandoned and
    // started over.
    let retry = |timeout: Duration| object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: config.read_retries_max,
        retry_timeout: timeout,
    };
    let limit = |timeout: Duration| format!("{}ms", timeout.as_millis());
    // A store's client with a time limit: from the environment's variables, or from a settings
    // file alone; the bucket's settings over them (`endpoint` under the store's own name for
    // it); hydrant's own limits last, so that no setting replaces them.
    macro_rules! store_builder {
        ($builder:ident, $key:ident, $endpoint_name:literal) => {
            |timeout: Duration| {
                let mut builder = match settings.from_file {
                    true => $builder::new(),
                    false => $builder::from_env(),
                }
                .with_url(&root);
                for (name, value) in store_settings(url, settings, $endpoint_name)? {
                    builder = builder.with_config(setting(url, &name)?, value);
                }
                builder
                    .with_retry(retry(timeout))
                    .with_config(
                        $key::Client(object_store::ClientConfigKey::Timeout),
                        limit(timeout),
                    )
                    .build()
                    .map(Arc::new)
                    .map_err(unavailable)
            }
        };
    }
    let (store, parts): (Arc<dyn ObjectStore>, Arc<dyn MultipartStore>) = match scheme {
        "s3" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let build = store_builder!(AmazonS3Builder, AmazonS3ConfigKey, "endpoint");
            (
                build(config.request_timeout)?,
                build(config.upload_timeout)?,
            )
        }
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let build = store_builder!(GoogleCloudStorageBuilder, GoogleConfigKey, "base_url");
            (
                build(config.request_timeout)?,
                build(config.upload_timeout)?,
            )
        }
        "az" => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let build = store_builder!(MicrosoftAzureBuilder, AzureConfigKey, "endpoint");
            (
                build(config.request_timeout)?,
                build(config.upload_timeout)?,
            )
        }
        other => unreachable!("scheme {other} passed check_url"),
    };
    Ok(Opened {
        store,
        parts: Some(parts),
        prefix,
        folder: None,
    })
}

/// A bucket's settings as its store's client takes them: `endpoint` under the name the store
/// gives it (`endpoint_name`), and an `http://` endpoint allowed to be plain HTTP, as naming
/// one says it should be.
fn store_settings(
    url: &str,
    settings: &StoreSettings,
    endpoint_name: &str,
) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::with_capacity(settings.pairs.len() + 1);
    for (name, value) in &settings.pairs {
        if name == "endpoint" {
            if value.starts_with("http://") {
                pairs.push(("allow_http".to_string(), "true".to_string()));
            } else if !value.starts_with("https://") {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!("origin {url}: endpoint {value:?} is not an http:// or https:// URL"),
                ));
            }
            pairs.push((endpoint_name.to_string(), value.clone()));
        } else {
            pairs.push((name.clone(), value.clone()));
        }
    }
    Ok(pairs)
}

/// The store client's key for a setting `name`, or a clear error naming the setting.
fn setting<K>(url: &str, name: &str) -> Result<K>
where
    K: std::str::FromStr,
{
    name.parse().map_err(|_| {
        Error::new(
            ErrorKind::InvalidConfig,
            format!(
                "origin {url}: unknown setting {name:?} (settings take object_store's names, such as aws_region, azure_storage_account_name or google_service_account)"
            ),
        )
    })
}

fn origin_error(
    counters: &OriginCounters,
    route: &Route,
    what: &str,
    error: object_store::Error,
) -> Error {
    counters.errors.fetch_add(1, Ordering::Relaxed);
    // Reads take NotFound as an answer before they get here; a PUT's (a bucket that does not
    // exist) will not change on retry either.
    // A multipart upload's NotFound (NoSuchUpload: a retried completion that had succeeded,
    // an upload the origin aborted) is worth starting over; a PUT's is not.
    let absent = matches!(error, object_store::Error::NotFound { .. }) && what == "store";
    let kind = if absent || is_permanent(&error) {
        ErrorKind::OriginRefused
    } else {
        ErrorKind::OriginUnavailable
    };
    let verdict = if kind == ErrorKind::OriginRefused {
        "refused to"
    } else {
        "failed to"
    };
    Error::new(
        kind,
        format!("origin {} {verdict} {what}: {error}", route.url),
    )
}

/// Whether an origin's answer will be the same however often the request is retried: it lacks
/// permission or credentials (but not an expired token or a skewed clock), cannot hold the name
/// (a folder origin asked for `x/y` where the file `x` is), or rejects the request outright (HTTP
/// 401, 403, 405, 411, 413, 414, or a 400 naming a name or size S3 refuses). Everything else is
/// transient: 5xx, SlowDown, timeouts, broken connections, 408/429, a 400 RequestTimeout, a 409
/// conflict on an object store, a full disk at the origin.
pub(crate) fn is_permanent(error: &object_store::Error) -> bool {
    use object_store::Error as Store;
    let message = error.to_string();
    let transient_words = [
        "RequestTimeTooSkewed",
        "ExpiredToken",
        "TokenRefreshRequired",
        "RequestExpired",
        "RequestTimeout",
        "OperationAborted",
    ];
    if transient_words.iter().any(|word| message.contains(word)) {
        return false;
    }
    // Local-folder errors carry the io::Error; HTTP ones their status in the message
    // (object_store's request error type is private).
    use std::io::ErrorKind as Io;
    let refused_io = io_kinds(error).any(|kind| {
        matches!(
            kind,
            Io::PermissionDenied
                | Io::AlreadyExists
                | Io::NotADirectory
                | Io::IsADirectory
                | Io::InvalidFilename
                | Io::ReadOnlyFilesystem
                | Io::DirectoryNotEmpty
        )
    });
    if refused_io {
        return true;
    }
    match error {
        Store::PermissionDenied { .. }
        | Store::Unauthenticated { .. }
        | Store::InvalidPath { .. }
        | Store::NotSupported { .. }
        | Store::NotImplemented { .. }
        | Store::UnknownConfigurationKey { .. } => true,
        _ => http_status(&message).is_some_and(|status| match status {
            401 | 403 | 405 | 411 | 413 | 414 => true,
            400 => [
                "KeyTooLong",
                "InvalidBucketName",
                "EntityTooLarge",
                "MetadataTooLarge",
                "InvalidArgument",
            ]
            .iter()
            .any(|code| message.contains(code)),
            _ => false,
        }),
    }
}

/// For a local-folder origin: whether `key` can be a file there, as far as the folder shows now
/// (`x/y` cannot when the file `x` exists, nor `x` when the folder `x/` does). Other origins
/// can name any key the grammar allows. Blocking: run on the origin pool.
pub(crate) fn check_nameable(route: &Route, key: &str) -> Result<()> {
    let Some(root) = route.url.strip_prefix("file://") else {
        return Ok(());
    };
    let refused = |what: String| {
        Err(Error::new(
            ErrorKind::OriginRefused,
            format!("origin {} cannot hold {key:?}: {what}", route.url),
        ))
    };
    let mut path = std::path::PathBuf::from(root);
    let segments: Vec<&str> = key.split('/').collect();
    for (index, segment) in segments.iter().enumerate() {
        path.push(segment);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(()); // nothing there yet: the rest can be made
        };
        let last = index + 1 == segments.len();
        if !last && !meta.is_dir() {
            return refused(format!("{} is a file", path.display()));
        }
        if last && meta.is_dir() {
            return refused(format!("{} is a folder of other objects", path.display()));
        }
    }
    Ok(())
}

/// A read of a path that cannot exist (a folder origin's `x/y` where `x` is a file): the
/// object is not there, as surely as if the path were free.
fn names_nothing(error: &object_store::Error) -> bool {
    io_kinds(error).any(|kind| kind == std::io::ErrorKind::NotADirectory)
}

/// The kinds of the io::Errors in an error's chain of sources.
fn io_kinds<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = std::io::ErrorKind> + 'a {
    std::iter::successors(Some(error), |current| current.source())
        .filter_map(|current| current.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind)
}

/// The HTTP status object_store names in an error's message ("... status code: 400 ...").
fn http_status(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

/// Read `range` (or, with `None`, the object from its start, at most `first_bytes_max` bytes:
/// the rest of the stream is dropped) under `condition`.
pub(crate) async fn fetch(
    counters: Arc<super::Origins>,
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
    origins: Arc<super::Origins>,
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

/// The highest `NAME#N` a folder origin's leftovers are looked for at (object_store stages each
/// write of `NAME` as the first free `NAME#1`, `NAME#2`, ... and renames it when complete).
const STAGED_SUFFIX_MAX: u32 = 8;

/// For a local-folder origin: remove the staged files that a process killed mid-write left
/// beside `path` (object_store hides them from listings, so nothing else ever would). Only
/// those last written before this engine opened go: a write of this process is never touched.
/// Called before each write and delete of `path`.
async fn remove_stale_staged(origins: &super::Origins, route: &Route, path: &Path) {
    let Some(folder) = &route.folder else {
        return;
    };
    let file = folder.join(path.as_ref());
    let opened_at = origins.opened_at;
    // Blocking file calls: on the origin pool's blocking threads.
    let _ = tokio::task::spawn_blocking(move || remove_staged_before(&file, opened_at)).await;
}

fn remove_staged_before(file: &std::path::Path, opened_at: std::time::SystemTime) {
    for suffix in 1..=STAGED_SUFFIX_MAX {
        let mut staged = file.as_os_str().to_owned();
        staged.push(format!("#{suffix}"));
        let staged = std::path::PathBuf::from(staged);
        let Ok(meta) = std::fs::symlink_metadata(&staged) else {
            continue;
        };
        let stale = meta.is_file() && meta.modified().is_ok_and(|modified| modified < opened_at);
        if !stale {
            continue;
        }
        match std::fs::remove_file(&staged) {
            Ok(()) => log::info!(
                "removed {}, an unfinished write left at the origin by an earlier run",
                staged.display()
            ),
            Err(error) => log::warn!("cannot remove {}: {error}", staged.display()),
        }
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

/// An object's attributes as `route`'s origin keeps them: an object store all but Expires
/// (which it has no field for), a local folder none (it keeps only the bytes).
pub(crate) fn origin_attributes(
    route: &Route,
    attributes: &crate::Attributes,
) -> object_store::Attributes {
    use object_store::Attribute;
    let mut kept = object_store::Attributes::new();
    if route.url.starts_with("file://") {
        return kept;
    }
    for (attribute, value) in [
        (Attribute::ContentType, &attributes.content_type),
        (Attribute::ContentEncoding, &attributes.content_encoding),
        (
            Attribute::ContentDisposition,
            &attributes.content_disposition,
        ),
        (Attribute::ContentLanguage, &attributes.content_language),
        (Attribute::CacheControl, &attributes.cache_control),
    ] {
        if let Some(value) = value {
            kept.insert(attribute, value.clone().into());
        }
    }
    for (name, value) in &attributes.metadata {
        kept.insert(
            Attribute::Metadata(name.clone().into()),
            value.clone().into(),
        );
    }
    kept
}

pub(crate) async fn put(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    path: Path,
    data: Bytes,
    attributes: object_store::Attributes,
) -> Result<Option<String>> {
    origins.counters.puts.fetch_add(1, Ordering::Relaxed);
    remove_stale_staged(&origins, &route, &path).await;
    let bytes = data.len() as u64;
    let options = object_store::PutOptions {
        attributes,
        ..Default::default()
    };
    match route
        .store
        .put_opts(&path, PutPayload::from(data), options)
        .await
    {
        Ok(result) => {
            origins
                .counters
                .bytes_out
                .fetch_add(bytes, Ordering::Relaxed);
            Ok(result.e_tag)
        }
        Err(error) => Err(origin_error(&origins.counters, &route, "store", error)),
    }
}

pub(crate) async fn start_multipart(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    path: Path,
    attributes: object_store::Attributes,
) -> Result<Box<dyn object_store::MultipartUpload>> {
    origins.counters.puts.fetch_add(1, Ordering::Relaxed);
    remove_stale_staged(&origins, &route, &path).await;
    let options = object_store::PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    route
        .store
        .put_multipart_opts(&path, options)
        .await
        .map_err(|error| origin_error(&origins.counters, &route, "start an upload", error))
}

pub(crate) async fn put_part(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    mut upload: Box<dyn object_store::MultipartUpload>,
    data: Bytes,
) -> Result<Box<dyn object_store::MultipartUpload>> {
    let bytes = data.len() as u64;
    match upload.put_part(PutPayload::from(data)).await {
        Ok(()) => {
            origins
                .counters
                .bytes_out
                .fetch_add(bytes, Ordering::Relaxed);
            Ok(upload)
        }
        Err(error) => {
            // The parts uploaded so far are abandoned; the next attempt starts over.
            let _ = upload.abort().await;
            Err(origin_error(
                &origins.counters,
                &route,
                "upload a part",
                error,
            ))
        }
    }
}

pub(crate) async fn finish_multipart(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    mut upload: Box<dyn object_store::MultipartUpload>,
) -> Result<Option<String>> {
    match upload.complete().await {
        Ok(result) => Ok(result.e_tag),
        Err(error) => {
            let _ = upload.abort().await;
            Err(origin_error(
                &origins.counters,
                &route,
                "complete an upload",
                error,
            ))
        }
    }
}

/// Begin a multipart upload of `path`, driven part by part (object stores only).
pub(crate) async fn create_upload(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    path: Path,
    attributes: object_store::Attributes,
) -> Result<MultipartId> {
    origins.counters.puts.fetch_add(1, Ordering::Relaxed);
    let options = object_store::PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    route
        .parts()
        .create_multipart_opts(&path, options)
        .await
        .map_err(|error| origin_error(&origins.counters, &route, "start an upload", error))
}

/// What the origin said to a part.
pub(crate) enum PartAnswer {
    Uploaded(PartId),
    /// SlowDown (or another 503) after `object_store`'s own retries: the prefix is throttled.
    SlowDown,
    /// The origin no longer knows the upload (it expired or was aborted): start over.
    Gone,
}

/// Upload part `index` (from 0) of upload `id`.
pub(crate) async fn upload_part(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    path: Path,
    id: MultipartId,
    index: usize,
    data: Bytes,
) -> Result<PartAnswer> {
    let bytes = data.len() as u64;
    match route
        .parts()
        .put_part(&path, &id, index, PutPayload::from(data))
        .await
    {
        Ok(part) => {
            origins
                .counters
                .bytes_out
                .fetch_add(bytes, Ordering::Relaxed);
            Ok(PartAnswer::Uploaded(part))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(PartAnswer::Gone),
        Err(error) if is_slow_down(&error) => {
            origins.counters.slow_downs.fetch_add(1, Ordering::Relaxed);
            Ok(PartAnswer::SlowDown)
        }
        Err(error) => Err(origin_error(
            &origins.counters,
            &route,
            "upload a part",
            error,
        )),
    }
}

/// Whether the origin asked to slow down: S3's SlowDown, or any 503.
fn is_slow_down(error: &object_store::Error) -> bool {
    let message = error.to_string();
    message.contains("SlowDown") || http_status(&message) == Some(503)
}

/// How a completion ended.
pub(crate) enum Completion {
    /// The object is at the origin, with this ETag when it gave one.
    Done(Option<String>),
    /// The origin no longer knows the upload and does not hold the object: start over.
    Gone,
}

/// Complete upload `id` of `path`, `bytes` long, from `parts`. A completion whose answer was lost
/// (a timeout, a broken connection, an error from an origin that had in fact finished it) is
/// checked with a HEAD, so that an object already assembled is neither uploaded again nor its
/// upload aborted: it counts as done when the origin's object has the upload's size and the
/// ETag S3 gives a multipart object (the MD5 of its parts' MD5s, then `-` and their count).
/// Where the parts' ETags are not MD5s (S3 with SSE-KMS or SSE-C, some compatible stores) the
/// object cannot be told from an older one of the same size, so an upload the origin has
/// forgotten starts over. Any other failure leaves the upload open, to be completed again by
/// the next attempt.
pub(crate) async fn complete_upload(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    path: Path,
    id: MultipartId,
    parts: Vec<PartId>,
    bytes: u64,
) -> Result<Completion> {
    let expected = multipart_etag(&parts);
    let error = match route.parts().complete_multipart(&path, &id, parts).await {
        Ok(result) => return Ok(Completion::Done(result.e_tag)),
        Err(error) => error,
    };
    let gone = matches!(error, object_store::Error::NotFound { .. });
    // Without MD5 part ETags no object at the origin can be recognised: no HEAD to ask.
    let found = match expected.as_deref() {
        Some(_) => {
            origins.counters.heads.fetch_add(1, Ordering::Relaxed);
            route.store.head(&path).await.ok()
        }
        None => None,
    };
    if let Some(meta) = found {
        if is_assembled(expected.as_deref(), bytes, meta.e_tag.as_deref(), meta.size) {
            log::info!(
                "origin {}: the completion of {path} failed ({error}), but the object it makes is there",
                route.url
            );
            return Ok(Completion::Done(meta.e_tag));
        }
    }
    if gone {
        return Ok(Completion::Gone);
    }
    Err(origin_error(
        &origins.counters,
        &route,
        "complete an upload",
        error,
    ))
}

/// Abort upload `id` of `path`; its parts are freed at the origin. Failures are logged only: an
/// upload left behind is what S3's lifecycle rules for incomplete uploads are for.
pub(crate) async fn abort_upload(route: Arc<Route>, path: Path, id: MultipartId) -> Result<()> {
    if let Err(error) = route.parts().abort_multipart(&path, &id).await {
        log::warn!(
            "origin {}: could not abort an upload of {path}: {error}",
            route.url
        );
    }
    Ok(())
}

/// The ETag S3 gives an object completed from `parts`: the MD5 of their MD5s (their ETags)
/// and their count; `None` when a part's ETag is not an MD5 (other stores, encryption with KMS).
/// Whether the origin's object (`etag`, `size`) is the one an upload of `bytes` whose parts make
/// the multipart ETag `expected` assembles. Without an expected ETag nothing tells it from an
/// older object of the same size: never.
fn is_assembled(expected: Option<&str>, bytes: u64, etag: Option<&str>, size: u64) -> bool {
    match (expected, etag) {
        (Some(expected), Some(etag)) => size == bytes && etag.trim_matches('"') == expected,
        _ => false,
    }
}

fn multipart_etag(parts: &[PartId]) -> Option<String> {
    use md5::{Digest, Md5};
    let mut digests = Md5::new();
    for part in parts {
        let etag = part.content_id.trim_matches('"');
        if etag.len() != 32 {
            return None;
        }
        for pair in etag.as_bytes().chunks(2) {
            let pair = std::str::from_utf8(pair).ok()?;
            digests.update([u8::from_str_radix(pair, 16).ok()?]);
        }
    }
    let digest = digests.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    Some(format!("{hex}-{}", parts.len()))
}

pub(crate) async fn delete(
    origins: Arc<super::Origins>,
    route: Arc<Route>,
    path: Path,
) -> Result<()> {
    origins.counters.deletes.fetch_add(1, Ordering::Relaxed);
    remove_stale_staged(&origins, &route, &path).await;
    match route.store.delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(error) => Err(origin_error(&origins.counters, &route, "delete", error)),
    }
}

/// Up to `limit` objects under `prefix` after the key `start_after`, as (key, version), in key
/// order.
pub(crate) async fn list(
    origins: Arc<super::Origins>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(message: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: message.into(),
        }
    }

    #[test]
    fn an_assembled_upload_is_recognised_only_by_its_multipart_etag_and_size() {
        let parts: Vec<PartId> = [
            "5d41402abc4b2a76b9719d911017c592",
            "7d793037a0760186574b0282f2f435e7",
        ]
        .iter()
        .map(|md5| PartId {
            content_id: format!("\"{md5}\""),
        })
        .collect();
        let expected = multipart_etag(&parts).expect("MD5 part ETags");
        assert!(expected.ends_with("-2"), "{expected}");
        let quoted = format!("\"{expected}\"");
        assert!(is_assembled(Some(&expected), 100, Some(&quoted), 100));
        assert!(!is_assembled(Some(&expected), 100, Some(&quoted), 99));
        assert!(!is_assembled(Some(&expected), 100, Some("\"0123-2\""), 100));
        assert!(!is_assembled(Some(&expected), 100, None, 100));
        // Parts whose ETags are not MD5s (SSE-KMS): an older object of the same size at the
        // path is not taken for the upload's.
        let opaque = [PartId {
            content_id: "block-0001".to_string(),
        }];
        assert_eq!(multipart_etag(&opaque), None);
        assert!(!is_assembled(None, 100, Some("\"older\""), 100));
        assert!(!is_assembled(None, 100, None, 100));
    }

    #[test]
    fn answers_that_will_not_change_are_permanent_and_the_rest_transient() {
        let permanent = [
            generic("Server returned non-2xx status code: 403 Forbidden: AccessDenied"),
            generic("Server returned non-2xx status code: 400 Bad Request: <Code>KeyTooLongError</Code>"),
            object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(std::io::Error::from(std::io::ErrorKind::NotADirectory)),
            },
            object_store::Error::PermissionDenied {
                path: "p".into(),
                source: "AccessDenied".into(),
            },
        ];
        for error in &permanent {
            assert!(is_permanent(error), "{error}");
        }
        let transient = [
            generic("Server returned non-2xx status code: 503 Service Unavailable: SlowDown"),
            generic(
                "Server returned non-2xx status code: 400 Bad Request: <Code>RequestTimeout</Code>",
            ),
            generic("Server returned non-2xx status code: 429 Too Many Requests"),
            generic("error sending request: connection refused"),
            object_store::Error::PermissionDenied {
                path: "p".into(),
                source: "ExpiredToken".into(),
            },
            object_store::Error::AlreadyExists {
                path: "p".into(),
                source: "OperationAborted".into(),
            },
            object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(std::io::Error::from(std::io::ErrorKind::StorageFull)),
            },
        ];
        for error in &transient {
            assert!(!is_permanent(error), "{error}");
        }
    }
}
