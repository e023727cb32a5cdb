//! hydrant-engine: the storage engine of a hydrant node.
//!
//! One shard per core, each with its own io_uring ring ([`rt`]), pinned buffer arena ([`buf`]),
//! share of every device ([`device`]), log-structured regions and index ([`store`]) in the
//! on-disk [`format`]; [`policy`] decides which objects a tier keeps. [`Engine`] is the front
//! door: it routes each call to the shard that owns the key and returns the answer to any thread.

mod attributes;
pub mod buf;
mod cache;
pub mod device;
mod error;
pub mod format;
mod key;
pub mod origin;
pub mod policy;
pub mod rt;
mod stamp;

pub use attributes::{Attributes, ATTRIBUTES_BYTES_MAX, CHECKSUM_ALGORITHMS, METADATA_BYTES_MAX};
pub use error::{Error, ErrorKind, Result};
mod engine;
mod shard;
pub mod store;
pub mod tier;
pub mod units;

pub use cache::{
    Cache, CacheRead, PartsRead, Placed, PlanStats, Precondition, ReadData, Within,
    PLANS_PER_SHARD_MAX, PLAN_READS_IN_FLIGHT,
};
pub use engine::{
    Engine, EngineConfig, EngineHandle, FormatPolicy, PutSink, SharedRead, StreamedChunk,
    CHUNK_BYTES_DEFAULT, CRC_BLOCK_BYTES_DEFAULT, IO_BYTES_IN_FLIGHT_MAX, IO_BYTES_IN_FLIGHT_MIN,
    LIST_LIMIT_MAX, REGION_BYTES_DEFAULT,
};
pub use key::STAGED_BUCKET;
pub use origin::{
    BucketOrigin, FailedUpload, OriginConfig, OriginStats, Revalidate, StoreSettings, WriteMode,
};
pub use stamp::{Md5Tag, Stamp};
pub use store::{ByteRange, ObjectKey, ObjectMeta, ObjectRead, ShardStats};
