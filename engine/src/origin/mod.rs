//! Origins: the object stores (S3, GCS, Azure, a local folder) that hold the truth behind the
//! cache.
//!
//! The origin clients are `object_store`'s, on a small tokio thread pool of their own ([`Origins`],
//! shared by every shard). A shard never blocks on them: it hands a request to the pool and awaits
//! the pool's join handle, whose waker reaches the shard's ring like any cross-thread wake-up.
//! What a shard does with the answers (read-through, write-back) lives in [`read`] and
//! [`writeback`], driven by the shard's tier stack (`cache/`).

pub(crate) mod journal;
pub(crate) mod parts;
pub(crate) mod read;
pub(crate) mod remote;
pub(crate) mod writeback;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::ObjectStore;

pub use remote::OriginVersion;
pub use writeback::FailedUpload;

use crate::{Error, ErrorKind, Result};

/// A shard's origin side: the shared origins, what this shard knows of them, its write-back.
pub(crate) struct ShardOrigin {
    pub origins: std::sync::Arc<Origins>,
    pub reads: std::rc::Rc<read::Reads>,
    pub writes: writeback::WriteBack,
}

/// How PUTs to a bucket reach its origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Acknowledge once the object is durable on NVMe; upload in the background.
    Back,
    /// Acknowledge once the origin has the object (and it is cached).
    Through,
    /// Refuse PUT and DELETE.
    ReadOnly,
}

/// When a cached copy of an origin object is checked against the origin again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revalidate {
    /// Never: origin objects are never overwritten in place.
    Immutable,
    /// After this long, a conditional GET with the cached ETag keeps the copy (304) or replaces it.
    Ttl(Duration),
}

/// One bucket's origin: where its objects live and how they are kept in step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketOrigin {
    /// `s3://bucket[/prefix]`, `gs://...`, `az://container[/prefix]` or `file:///path`.
    pub url: String,
    pub write: WriteMode,
    pub revalidate: Revalidate,
    /// The object store client's settings for this bucket alone (endpoint, credentials,
    /// region...), over those the environment gives.
    pub settings: StoreSettings,
}

/// Settings of an object store client, by `object_store`'s names (`aws_access_key_id`,
/// `azure_storage_account_key`, `google_service_account`...), plus `endpoint`. Their values
/// may be secrets: `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreSettings {
    pub pairs: Vec<(String, String)>,
    /// Whether they came from a settings file, which then stands instead of the environment's
    /// variables (credentials from both would be mixed into wrong signatures).
    pub from_file: bool,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_list()
            .entries(self.pairs.iter().map(|(name, _)| name))
            .finish()
    }
}

/// The longest setting name a settings file may hold (`object_store`'s are far shorter): a
/// longer one is more likely a value on a line of its own, which must not reach an error.
pub const SETTING_NAME_BYTES_MAX: usize = 64;

/// The largest settings file read (`settings=FILE`): a few keys, not a data file.
pub const SETTINGS_FILE_BYTES_MAX: u64 = 64 << 10;

impl BucketOrigin {
    /// Parse `URL[,write=back|through|read-only][,revalidate=immutable|ttl=DURATION]
    /// [,endpoint=URL][,settings=FILE]`.
    pub fn parse(spec: &str, defaults: &BucketOrigin) -> Result<BucketOrigin> {
        let mut parts = spec.split(',');
        let url = parts.next().unwrap_or_default().trim().to_string();
        let mut origin = BucketOrigin {
            url,
            write: defaults.write,
            revalidate: defaults.revalidate,
            settings: defaults.settings.clone(),
        };
        for option in parts {
            let (name, value) = option.split_once('=').ok_or_else(|| {
                invalid(format!(
                    "origin option {option:?} is not NAME=VALUE (write=..., revalidate=..., endpoint=..., settings=...)"
                ))
            })?;
            let value = value.trim();
            match name.trim() {
                "write" => origin.write = parse_write_mode(value)?,
                "revalidate" => origin.revalidate = parse_revalidate(value)?,
                "endpoint" => origin
                    .settings
                    .pairs
                    .push(("endpoint".into(), value.into())),
                "settings" => {
                    origin.settings.pairs.extend(read_settings(value)?);
                    origin.settings.from_file = true;
                }
                other => {
                    return Err(invalid(format!(
                        "unknown origin option {other:?}; the options are write=, revalidate=, endpoint= and settings="
                    )))
                }
            }
        }
        check_url(&origin.url)?;
        if origin.url.starts_with("file://") && !origin.settings.pairs.is_empty() {
            return Err(invalid(format!(
                "origin {}: endpoint= and settings= apply to object stores, not folders",
                origin.url
            )));
        }
        Ok(origin)
    }
}

/// The `NAME=VALUE` lines of a settings file (blank lines and `#` comments skipped, quotes
/// around a value dropped), names in lower case.
fn read_settings(path: &str) -> Result<Vec<(String, String)>> {
    let cannot =
        |error: std::io::Error| invalid(format!("cannot read the settings file {path}: {error}"));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut text = String::new();
    use std::io::Read;
    file.take(SETTINGS_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > SETTINGS_FILE_BYTES_MAX {
        return Err(invalid(format!(
            "the settings file {path} is over {SETTINGS_FILE_BYTES_MAX} bytes"
        )));
    }
    let mut settings = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // The line itself never reaches an error: it may hold a secret.
        let not_a_setting = || {
            invalid(format!(
                "line {} of the settings file {path} is not NAME=VALUE with a NAME of letters, digits and _",
                index + 1
            ))
        };
        let (name, value) = line.split_once('=').ok_or_else(not_a_setting)?;
        let name = name.trim();
        if name.is_empty()
            || name.len() > SETTING_NAME_BYTES_MAX
            || !name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
        {
            return Err(not_a_setting());
        }
        let value = value.trim();
        let unquoted = value
            .strip_prefix('"')
            .and_then(|inner| inner.strip_suffix('"'))
            .unwrap_or(value);
        settings.push((name.to_ascii_lowercase(), unquoted.to_string()));
    }
    Ok(settings)
}

pub fn parse_write_mode(value: &str) -> Result<WriteMode> {
    match value {
        "back" => Ok(WriteMode::Back),
        "through" => Ok(WriteMode::Through),
        "read-only" => Ok(WriteMode::ReadOnly),
        other => Err(invalid(format!(
            "write mode {other:?} is not back, through or read-only"
        ))),
    }
}

pub fn parse_revalidate(value: &str) -> Result<Revalidate> {
    if value == "immutable" {
        return Ok(Revalidate::Immutable);
    }
    match value.strip_prefix("ttl=") {
        Some(duration) => Ok(Revalidate::Ttl(crate::units::parse_duration(duration)?)),
        None => Err(invalid(format!(
            "revalidation {value:?} is not immutable or ttl=DURATION"
        ))),
    }
}

fn check_url(url: &str) -> Result<()> {
    let known = ["s3://", "gs://", "az://", "file:///"];
    if known.iter().any(|scheme| url.starts_with(scheme)) {
        Ok(())
    } else {
        Err(invalid(format!(
            "origin {url:?} is not s3://bucket[/prefix], gs://bucket[/prefix], az://container[/prefix] or file:///path"
        )))
    }
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, message)
}

/// Which origins the cache buckets map to, and the limits of talking to them. Every option has a
/// default (see `OriginConfig::new`).
#[derive(Clone, Debug)]
pub struct OriginConfig {
    /// The default origin: a cache bucket `B` without an entry of its own maps to `URL/B/`, with
    /// the default write mode and revalidation. `None`: such buckets live on NVMe only.
    pub default_url: Option<String>,
    pub default_write: WriteMode,
    pub default_revalidate: Revalidate,
    /// Cache buckets mapped to origins of their own.
    pub buckets: HashMap<String, BucketOrigin>,
    /// The dirty-byte budget (high watermark): above it a write-back PUT waits.
    pub dirty_bytes_max: u64,
    /// Once the budget is full, writers wait until dirty bytes fall to this low watermark.
    pub dirty_bytes_low: u64,
    /// How long a write-back PUT waits for room in the budget before it is answered BUSY.
    pub put_wait_max: Duration,
    /// Bytes of uploads the origin refused that may be held on NVMe; above it write-back PUTs
    /// are refused (ORIGIN_REFUSED) until they are retried or deleted.
    pub failed_bytes_max: u64,
    /// Objects above this size are uploaded in parts.
    pub multipart_threshold_bytes: u64,
    /// The part size of multipart uploads (S3 needs at least 5 MiB for all but the last part);
    /// larger for an object that would otherwise need more than S3's 10,000 parts.
    pub part_bytes: u64,
    /// Objects uploading at once per shard.
    pub uploads_per_shard_max: usize,
    /// Parts of one object uploading at once (to an object store).
    pub parts_in_flight_per_upload_max: usize,
    /// Bytes of parts in flight for the whole node (read from NVMe, held in memory, on their way
    /// to the origin); a part waits for room. At least one part.
    pub part_bytes_in_flight_max: u64,
    /// How long HEAD answers from the origin are reused.
    pub metadata_ttl: Duration,
    /// Objects whose origin metadata a shard keeps in memory.
    pub metadata_entries_max: usize,
    /// Threads of the pool that runs origin requests.
    pub threads: usize,
    /// One origin request's time limit, retries included, for reads and metadata.
    pub request_timeout: Duration,
    /// One upload request's time limit, retries included: a part, or the completion of a
    /// multipart upload, which S3 may take minutes to assemble for a large object.
    pub upload_timeout: Duration,
    /// Retries (with exponential backoff) of a failed read request before the reader is told
    /// ORIGIN_UNAVAILABLE. Uploads retry until they succeed.
    pub read_retries_max: usize,
    /// The longest wait between two upload attempts.
    pub upload_backoff_max: Duration,
}

impl OriginConfig {
    pub fn new() -> OriginConfig {
        OriginConfig {
            default_url: None,
            default_write: WriteMode::Back,
            default_revalidate: Revalidate::Immutable,
            buckets: HashMap::new(),
            dirty_bytes_max: 4 << 30,
            dirty_bytes_low: 3 << 30,
            put_wait_max: Duration::from_secs(30),
            failed_bytes_max: 4 << 30,
            multipart_threshold_bytes: 16 << 20,
            part_bytes: 16 << 20,
            uploads_per_shard_max: 4,
            parts_in_flight_per_upload_max: 8,
            part_bytes_in_flight_max: 256 << 20,
            metadata_ttl: Duration::from_secs(5),
            metadata_entries_max: 100_000,
            threads: 2,
            request_timeout: Duration::from_secs(30),
            upload_timeout: Duration::from_secs(600),
            read_retries_max: 2,
            upload_backoff_max: Duration::from_secs(10),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(url) = &self.default_url {
            check_url(url)?;
        }
        for (bucket, origin) in &self.buckets {
            crate::store::ObjectKey::prefix(bucket, "")?;
            check_url(&origin.url)?;
        }
        if self.dirty_bytes_low > self.dirty_bytes_max {
            return Err(invalid(format!(
                "the dirty low watermark ({}) is above the budget ({})",
                self.dirty_bytes_low, self.dirty_bytes_max
            )));
        }
        if self.part_bytes < 5 << 20 || self.multipart_threshold_bytes < self.part_bytes {
            return Err(invalid(
                "parts must be at least 5 MiB and the multipart threshold at least a part".into(),
            ));
        }
        if self.part_bytes_in_flight_max < self.part_bytes
            || self.part_bytes_in_flight_max > 64 << 30
            || self.parts_in_flight_per_upload_max == 0
        {
            return Err(invalid(
                "part bytes in flight must be at least a part and at most 64 GiB, and parts in flight per upload at least 1".into(),
            ));
        }
        if self.threads == 0 || self.threads > 64 || self.uploads_per_shard_max == 0 {
            return Err(invalid(
                "origin threads must be 1-64 and uploads per shard at least 1".into(),
            ));
        }
        Ok(())
    }
}

impl Default for OriginConfig {
    fn default() -> OriginConfig {
        OriginConfig::new()
    }
}

/// A cache bucket's resolved origin: the store client, the path prefix inside it, and its rules.
pub(crate) struct Route {
    pub store: Arc<dyn ObjectStore>,
    /// For object stores: multipart uploads part by part, with the upload time limit.
    pub parts: Option<Arc<dyn MultipartStore>>,
    pub prefix: Option<Path>,
    pub write: WriteMode,
    pub revalidate: Revalidate,
    /// The origin as the operator wrote it, for messages.
    pub url: String,
    /// Whether the store lists in key order (object stores do; a local folder does not).
    pub listing_sorted: bool,
    /// For a local folder: the folder the store's paths are under.
    pub folder: Option<std::path::PathBuf>,
    /// Pauses uploads here after SlowDown answers.
    pub throttle: parts::Throttle,
    /// For S3: PUTs that carry the writer's checksum.
    pub signed: Option<Arc<remote::SignedPuts>>,
}

impl Route {
    /// The multipart store; only called where `parts` is set.
    pub(crate) fn parts(&self) -> &dyn MultipartStore {
        self.parts
            .as_deref()
            .expect("part-wise uploads only to object stores")
    }

    /// Where `key` lives at the origin, or an error for keys an object store cannot name.
    pub fn path(&self, key: &str) -> Result<Path> {
        let full = match &self.prefix {
            Some(prefix) => format!("{prefix}/{key}"),
            None => key.to_string(),
        };
        let refused = |reason: String| {
            Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "key {key:?} cannot be named at origin {}: {reason}",
                    self.url
                ),
            )
        };
        // The grammar first (an object recovered from an older store may break it): nothing a
        // URL parser could read as a dot segment reaches a store.
        hydrant_proto::name::check_key(key).map_err(|error| refused(error.to_string()))?;
        let path = Path::parse(&full).map_err(|error| refused(error.to_string()))?;
        // Object stores name objects by '/'-separated segments: a key with an empty segment
        // (a leading, trailing or doubled '/') would alias another key.
        if path.as_ref() != full {
            return Err(refused(
                "keys may not start or end with '/' or contain '//'".into(),
            ));
        }
        Ok(path)
    }

    /// The cache key of an origin path listed under this route's prefix.
    pub fn key_of(&self, path: &Path) -> Option<String> {
        let text = path.as_ref();
        match &self.prefix {
            Some(prefix) => text
                .strip_prefix(prefix.as_ref())
                .and_then(|rest| rest.strip_prefix('/'))
                .map(str::to_string),
            None => Some(text.to_string()),
        }
    }
}

/// The origins of every bucket and the pool that talks to them; shared by all shards.
pub struct Origins {
    config: OriginConfig,
    runtime: Option<tokio::runtime::Runtime>,
    /// The buckets of the configuration, resolved at the start.
    configured: HashMap<String, Arc<Route>>,
    /// The default origin's store, opened once: every other bucket is a prefix inside it.
    default: Option<DefaultOrigin>,
    /// Routes of default-origin buckets already asked for, at most `DEFAULT_ROUTES_MAX` (a
    /// client can name any number of buckets; a route forgotten is rebuilt, never wrong).
    default_routes: std::sync::Mutex<HashMap<String, Arc<Route>>>,
    /// Bytes of dirty objects (and of write-back PUTs admitted but not yet stored), all shards.
    dirty_bytes: AtomicU64,
    /// Set when the budget filled; writers wait until dirty bytes reach the low watermark.
    backpressure: AtomicBool,
    /// Refused uploads held on NVMe (apart from the dirty budget): their bytes and count.
    failed_bytes: AtomicU64,
    failed_uploads: AtomicU64,
    /// Room for part bytes in flight, node-wide, in KiB (`part_bytes_in_flight_max`).
    part_budget: tokio::sync::Semaphore,
    pub(crate) counters: OriginCounters,
    /// When the engine opened: a folder origin's staged file older than this was left by an
    /// earlier process, never by a write of this one.
    pub(crate) opened_at: std::time::SystemTime,
}

/// Routes of default-origin buckets kept for reuse.
const DEFAULT_ROUTES_MAX: usize = 1024;

/// Threads the origin pool may start for blocking work (a folder origin's file reads and
/// writes); more tasks wait in tokio's queue. tokio's own default is 512, and each thread holds
/// a stack (2 MiB: a whole huge page where transparent huge pages are always on).
const ORIGIN_BLOCKING_THREADS_MAX: usize = 16;

/// The default origin, under which bucket `B` is the prefix `B`.
struct DefaultOrigin {
    store: Arc<dyn ObjectStore>,
    parts: Option<Arc<dyn MultipartStore>>,
    prefix: Option<Path>,
    folder: Option<std::path::PathBuf>,
    signed: Option<Arc<remote::SignedPuts>>,
    url: String,
}

/// Origin traffic since the engine opened.
#[derive(Default)]
pub struct OriginCounters {
    pub gets: AtomicU64,
    pub heads: AtomicU64,
    pub puts: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub errors: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub uploads_retried: AtomicU64,
    /// Parts being read or uploaded now, and their bytes.
    pub parts_in_flight: AtomicU64,
    pub part_bytes_in_flight: AtomicU64,
    /// Parts the origin answered with SlowDown (or 503), after object_store's own retries.
    pub slow_downs: AtomicU64,
    /// Time from a write-back PUT's acknowledgement to its version being at the origin, by
    /// `CLEAN_BUCKETS_MS` (the last is +Inf), their sum and count.
    pub clean_buckets: [AtomicU64; CLEAN_BUCKETS_MS.len() + 1],
    pub clean_sum_ms: AtomicU64,
}

/// Upper bounds of the acknowledgement-to-clean histogram's buckets, in milliseconds.
pub const CLEAN_BUCKETS_MS: [u64; 10] = [
    100, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 1_800_000, 3_600_000,
];

impl OriginCounters {
    pub(crate) fn observe_clean(&self, waited: Duration) {
        let millis = waited.as_millis() as u64;
        let bucket = CLEAN_BUCKETS_MS
            .iter()
            .position(|&bound| millis <= bound)
            .unwrap_or(CLEAN_BUCKETS_MS.len());
        self.clean_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.clean_sum_ms.fetch_add(millis, Ordering::Relaxed);
    }
}

/// A copy of the origin counters and the dirty state, for STATS and metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct OriginStats {
    pub gets: u64,
    pub heads: u64,
    pub puts: u64,
    pub lists: u64,
    pub deletes: u64,
    pub errors: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub uploads_retried: u64,
    pub dirty_bytes: u64,
    pub dirty_bytes_max: u64,
    /// Refused uploads held on NVMe (see `WriteBack`'s failed versions).
    pub failed_bytes: u64,
    pub failed_uploads: u64,
    pub parts_in_flight: u64,
    pub part_bytes_in_flight: u64,
    pub slow_downs: u64,
    /// Per `CLEAN_BUCKETS_MS` bucket (not cumulative), then the sum in milliseconds.
    pub clean_buckets: [u64; CLEAN_BUCKETS_MS.len() + 1],
    pub clean_sum_ms: u64,
}

impl Origins {
    pub(crate) fn start(config: OriginConfig) -> Result<Origins> {
        config.validate()?;
        let part_budget_kib = (config.part_bytes_in_flight_max >> 10) as usize;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.threads)
            .max_blocking_threads(ORIGIN_BLOCKING_THREADS_MAX)
            .thread_name("hydrant-origin")
            .enable_all()
            .build()
            .map_err(|error| Error::io("cannot start the origin threads", error))?;
        let mut origins = Origins {
            config,
            runtime: Some(runtime),
            configured: HashMap::new(),
            default: None,
            default_routes: std::sync::Mutex::new(HashMap::new()),
            dirty_bytes: AtomicU64::new(0),
            backpressure: AtomicBool::new(false),
            failed_bytes: AtomicU64::new(0),
            failed_uploads: AtomicU64::new(0),
            part_budget: tokio::sync::Semaphore::new(part_budget_kib),
            counters: OriginCounters::default(),
            opened_at: std::time::SystemTime::now(),
        };
        // Resolve the configured buckets and open the default origin now, so that a bad URL or
        // missing credentials stop the start instead of the first request.
        let mut configured = HashMap::new();
        for (bucket, origin) in &origins.config.buckets {
            configured.insert(bucket.clone(), Arc::new(origins.resolve(origin)?));
        }
        origins.configured = configured;
        if let Some(url) = origins.config.default_url.clone() {
            let _context = origins.runtime().enter();
            let opened = remote::open_store(&url, &StoreSettings::default(), &origins.config)?;
            origins.default = Some(DefaultOrigin {
                store: opened.store,
                parts: opened.parts,
                prefix: opened.prefix,
                folder: opened.folder,
                signed: opened.signed,
                url: url.trim_end_matches('/').to_string(),
            });
        }
        Ok(origins)
    }

    pub fn config(&self) -> &OriginConfig {
        &self.config
    }

    /// The origin of cache bucket `bucket`, or `None` when it lives on NVMe only. A bucket name
    /// outside the grammar (an object recovered from an older store) has none to go to: it is
    /// refused, so that nothing can be routed outside its place.
    pub(crate) fn route(&self, bucket: &str) -> Result<Option<Arc<Route>>> {
        if let Some(route) = self.configured.get(bucket) {
            return Ok(Some(route.clone()));
        }
        let Some(default) = &self.default else {
            return Ok(None);
        };
        hydrant_proto::name::check_bucket(bucket).map_err(|error| {
            Error::new(
                ErrorKind::InvalidKey,
                format!("bucket {bucket:?} cannot be routed to an origin: {error}"),
            )
        })?;
        let mut routes = self.default_routes.lock().expect("routes lock");
        if let Some(route) = routes.get(bucket) {
            return Ok(Some(route.clone()));
        }
        let prefix = match &default.prefix {
            Some(prefix) => format!("{prefix}/{bucket}"),
            None => bucket.to_string(),
        };
        let route = Arc::new(Route {
            store: default.store.clone(),
            parts: default.parts.clone(),
            prefix: Some(Path::from(prefix)),
            write: self.config.default_write,
            revalidate: self.config.default_revalidate,
            url: format!("{}/{bucket}", default.url),
            listing_sorted: !default.url.starts_with("file://"),
            folder: default.folder.clone(),
            throttle: parts::Throttle::default(),
            signed: default.signed.clone(),
        });
        if routes.len() >= DEFAULT_ROUTES_MAX {
            if let Some(victim) = routes.keys().next().cloned() {
                routes.remove(&victim);
            }
        }
        routes.insert(bucket.to_string(), route.clone());
        Ok(Some(route))
    }

    fn resolve(&self, origin: &BucketOrigin) -> Result<Route> {
        let _context = self.runtime().enter();
        let opened = remote::open_store(&origin.url, &origin.settings, &self.config)?;
        Ok(Route {
            store: opened.store,
            parts: opened.parts,
            prefix: opened.prefix,
            write: origin.write,
            revalidate: origin.revalidate,
            url: origin.url.clone(),
            listing_sorted: !origin.url.starts_with("file://"),
            folder: opened.folder,
            throttle: parts::Throttle::default(),
            signed: opened.signed,
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("origin runtime runs until drop")
    }

    /// Run `task` on the origin pool; the returned future may be awaited on a shard.
    /// The buckets this node can name: those configured with an origin of their own, and the
    /// top-level folders (prefixes) of the default origin that are valid bucket names, sorted.
    pub(crate) fn bucket_names(
        self: &Arc<Self>,
    ) -> impl Future<Output = Result<Vec<String>>> + 'static {
        let mut names: Vec<String> = self.configured.keys().cloned().collect();
        let default = self
            .default
            .as_ref()
            .map(|default| (default.store.clone(), default.prefix.clone()));
        let task = async move {
            if let Some((store, prefix)) = default {
                let listing =
                    store
                        .list_with_delimiter(prefix.as_ref())
                        .await
                        .map_err(|error| {
                            Error::new(
                                ErrorKind::OriginUnavailable,
                                format!("cannot list the default origin's buckets: {error}"),
                            )
                        })?;
                for folder in listing.common_prefixes {
                    if let Some(name) = folder.filename() {
                        if hydrant_proto::name::check_bucket(name).is_ok() {
                            names.push(name.to_string());
                        }
                    }
                }
            }
            names.sort();
            names.dedup();
            Ok(names)
        };
        self.run(task)
    }

    pub(crate) fn run<T, F>(&self, task: F) -> impl Future<Output = Result<T>> + 'static
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let handle = self.runtime().spawn(task);
        async move {
            handle.await.unwrap_or_else(|error| {
                Err(Error::new(
                    ErrorKind::OriginUnavailable,
                    format!("an origin request did not finish: {error}"),
                ))
            })
        }
    }

    /// Take `bytes` from the dirty budget, waiting (on the shard) while it is full; BUSY after
    /// `put_wait_max`.
    pub(crate) async fn reserve_dirty(&self, bytes: u64) -> Result<()> {
        // An object larger than the whole budget takes it alone: it waits until no other
        // write-back bytes are held (dirty bytes then exceed the budget by at most that object,
        // and nobody else is admitted until it is uploaded).
        let alone = bytes > self.config.dirty_bytes_max;
        let started = std::time::Instant::now();
        loop {
            let current = self.dirty_bytes.load(Ordering::Acquire);
            if self.backpressure.load(Ordering::Acquire) && current <= self.config.dirty_bytes_low {
                self.backpressure.store(false, Ordering::Release);
            }
            if !self.backpressure.load(Ordering::Acquire) {
                let fits = if alone {
                    current == 0
                } else {
                    current + bytes <= self.config.dirty_bytes_max
                };
                if fits {
                    if self
                        .dirty_bytes
                        .compare_exchange(
                            current,
                            current + bytes,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        return Ok(());
                    }
                    continue;
                }
                self.backpressure.store(true, Ordering::Release);
            }
            if started.elapsed() >= self.config.put_wait_max {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "the dirty budget ({} of {} bytes) stayed full for {:?}; the origin is slower than the writers",
                        current, self.config.dirty_bytes_max, self.config.put_wait_max
                    ),
                ));
            }
            crate::rt::time::sleep(DIRTY_POLL_INTERVAL).await;
        }
    }

    /// Bytes of refused uploads held on NVMe, all shards.
    pub(crate) fn failed_bytes(&self) -> u64 {
        self.failed_bytes.load(Ordering::Acquire)
    }

    pub(crate) fn add_failed(&self, bytes: u64) {
        self.failed_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.failed_uploads.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn forget_failed(&self, bytes: u64) {
        let previous = self.failed_bytes.fetch_sub(bytes, Ordering::AcqRel);
        assert!(previous >= bytes, "refused bytes forgotten twice");
        self.failed_uploads.fetch_sub(1, Ordering::AcqRel);
    }

    /// Refuse a write-back PUT while refused uploads hold more than their bound: a flood of
    /// refusals ends in a clear error, never in dirty data that nothing reports.
    pub(crate) fn check_failed_room(&self) -> Result<()> {
        let held = self.failed_bytes();
        if held > self.config.failed_bytes_max {
            return Err(Error::new(
                ErrorKind::OriginRefused,
                format!(
                    "{held} bytes of writes the origin refused are held on NVMe (at most {}); retry them (hydrant uploads --retry) or delete them first",
                    self.config.failed_bytes_max
                ),
            ));
        }
        Ok(())
    }

    /// Give back bytes taken by `reserve_dirty` (the object is clean, superseded or never stored).
    pub(crate) fn release_dirty(&self, bytes: u64) {
        let previous = self.dirty_bytes.fetch_sub(bytes, Ordering::AcqRel);
        assert!(previous >= bytes, "dirty bytes released twice");
    }

    /// Count dirty objects found on the device at open; they may exceed the budget.
    pub(crate) fn add_recovered_dirty(&self, bytes: u64) {
        self.dirty_bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> OriginStats {
        let counters = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        OriginStats {
            gets: load(&counters.gets),
            heads: load(&counters.heads),
            puts: load(&counters.puts),
            lists: load(&counters.lists),
            deletes: load(&counters.deletes),
            errors: load(&counters.errors),
            bytes_in: load(&counters.bytes_in),
            bytes_out: load(&counters.bytes_out),
            uploads_retried: load(&counters.uploads_retried),
            dirty_bytes: self.dirty_bytes(),
            dirty_bytes_max: self.config.dirty_bytes_max,
            failed_bytes: self.failed_bytes(),
            failed_uploads: self.failed_uploads.load(Ordering::Acquire),
            parts_in_flight: load(&counters.parts_in_flight),
            part_bytes_in_flight: load(&counters.part_bytes_in_flight),
            slow_downs: load(&counters.slow_downs),
            clean_buckets: std::array::from_fn(|bucket| load(&counters.clean_buckets[bucket])),
            clean_sum_ms: load(&counters.clean_sum_ms),
        }
    }

    /// Wait for room for a part of `bytes` among the part bytes in flight (a part larger than
    /// the whole budget waits for all of it).
    pub(crate) async fn part_budget(&self, bytes: u64) -> tokio::sync::SemaphorePermit<'_> {
        let kib = bytes
            .div_ceil(1024)
            .min(self.config.part_bytes_in_flight_max >> 10) as u32;
        self.part_budget
            .acquire_many(kib)
            .await
            .expect("the part budget is never closed")
    }
}

/// How often a writer waiting for room in the dirty budget looks again.
const DIRTY_POLL_INTERVAL: Duration = Duration::from_millis(5);

impl Drop for Origins {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_specs_parse_and_bad_ones_are_refused() {
        let defaults = BucketOrigin {
            url: String::new(),
            write: WriteMode::Back,
            revalidate: Revalidate::Immutable,
            settings: StoreSettings::default(),
        };
        let parsed = BucketOrigin::parse(
            "s3://data/train,write=through,revalidate=ttl=30s",
            &defaults,
        )
        .unwrap();
        assert_eq!(parsed.url, "s3://data/train");
        assert_eq!(parsed.write, WriteMode::Through);
        assert_eq!(parsed.revalidate, Revalidate::Ttl(Duration::from_secs(30)));
        let plain = BucketOrigin::parse("file:///tmp/x", &defaults).unwrap();
        assert_eq!(plain.write, WriteMode::Back);
        for bad in [
            "http://x",
            "s3://x,write=sometimes",
            "s3://x,color=red",
            "s3://x,revalidate=ttl=soon",
            "s3://x,write",
        ] {
            let error = BucketOrigin::parse(bad, &defaults).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{bad}");
        }
    }

    #[test]
    fn a_buckets_endpoint_and_settings_file_are_read_and_kept_out_of_debug() {
        let defaults = BucketOrigin {
            url: String::new(),
            write: WriteMode::Back,
            revalidate: Revalidate::Immutable,
            settings: StoreSettings::default(),
        };
        let directory =
            std::env::temp_dir().join(format!("hydrant-settings-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let file = directory.join("azure.env");
        std::fs::write(
            &file,
            "# the account\n\nAZURE_STORAGE_ACCOUNT_NAME = devstore\nazure_storage_account_key=\"c2VjcmV0\"\n",
        )
        .unwrap();
        let spec = format!(
            "az://shards/train,endpoint=http://127.0.0.1:10000/devstore,settings={}",
            file.display()
        );
        let parsed = BucketOrigin::parse(&spec, &defaults).unwrap();
        assert_eq!(parsed.url, "az://shards/train");
        assert_eq!(
            parsed.settings.pairs,
            [
                (
                    "endpoint".to_string(),
                    "http://127.0.0.1:10000/devstore".to_string()
                ),
                (
                    "azure_storage_account_name".to_string(),
                    "devstore".to_string()
                ),
                (
                    "azure_storage_account_key".to_string(),
                    "c2VjcmV0".to_string()
                ),
            ]
        );
        let shown = format!("{parsed:?}");
        assert!(shown.contains("azure_storage_account_key"), "{shown}");
        assert!(
            !shown.contains("c2VjcmV0"),
            "a secret reached Debug: {shown}"
        );

        std::fs::write(&file, "azure_storage_account_name devstore\n").unwrap();
        let error = BucketOrigin::parse(&spec, &defaults).unwrap_err();
        assert!(error.to_string().contains("line 1"), "{error}");
        // A key pasted on a line of its own splits at its base64 padding: refused by its line
        // number, the key not shown.
        std::fs::write(&file, "# key\nc2VjcmV0IGtleQ/abc+def==\n").unwrap();
        let error = BucketOrigin::parse(&spec, &defaults).unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
        assert!(
            !error.to_string().contains("c2Vj"),
            "a secret reached an error: {error}"
        );
        std::fs::write(&file, vec![b'#'; SETTINGS_FILE_BYTES_MAX as usize + 1]).unwrap();
        let error = BucketOrigin::parse(&spec, &defaults).unwrap_err();
        assert!(error.to_string().contains("is over"), "{error}");
        std::fs::remove_dir_all(&directory).unwrap();
        let error = BucketOrigin::parse(&spec, &defaults).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidConfig);
        assert!(
            error.to_string().contains("cannot read the settings file"),
            "{error}"
        );
        let error = BucketOrigin::parse("file:///tmp/x,endpoint=http://a", &defaults).unwrap_err();
        assert!(error.to_string().contains("not folders"), "{error}");
    }

    #[test]
    fn an_endpoint_that_is_not_http_or_an_unknown_setting_is_refused_when_the_store_opens() {
        let config = OriginConfig::new();
        let open = |url: &str, pairs: &[(&str, &str)]| {
            let settings = StoreSettings {
                pairs: pairs
                    .iter()
                    .map(|(name, value)| (name.to_string(), value.to_string()))
                    .collect(),
                from_file: true,
            };
            remote::open_store(url, &settings, &config).map(|_| ())
        };
        let error = open("s3://b", &[("endpoint", "ftp://x")]).unwrap_err();
        assert!(error.to_string().contains("not an http"), "{error}");
        let error = open("az://c", &[("azure_colour", "blue")]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidConfig);
        assert!(
            error
                .to_string()
                .contains("unknown setting \"azure_colour\""),
            "{error}"
        );
        open(
            "s3://b",
            &[
                ("endpoint", "http://127.0.0.1:1"),
                ("aws_region", "us-east-1"),
            ],
        )
        .unwrap();
    }
}
