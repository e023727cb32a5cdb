//! What an origin's failure means: refused for good (permission, a name it cannot hold) or
//! worth retrying, a throttle, or a path that names nothing.

use std::sync::atomic::Ordering;

use crate::origin::{OriginCounters, Route};
use crate::{Error, ErrorKind, Result};

pub(super) fn origin_error(
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
pub(super) fn is_permanent(error: &object_store::Error) -> bool {
    use object_store::Error as Store;
    let message = error.to_string();
    if is_transient_code(&message) {
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
        _ => http_status(&message).is_some_and(|status| refused_status(status, &message)),
    }
}

/// Error codes that refuse a request only for now, whatever its status (a skewed clock, an
/// expired token, a request the origin gave up waiting for).
fn is_transient_code(message: &str) -> bool {
    [
        "RequestTimeTooSkewed",
        "ExpiredToken",
        "TokenRefreshRequired",
        "RequestExpired",
        "RequestTimeout",
        "OperationAborted",
    ]
    .iter()
    .any(|code| message.contains(code))
}

/// Whether an HTTP answer of `status`, whose error says `message`, will be the same however
/// often the request is retried (see `is_permanent`). A BadDigest (the bytes differ from the
/// checksum they were sent with) is too: the same bytes are sent again.
pub(super) fn refused_status(status: u16, message: &str) -> bool {
    if is_transient_code(message) {
        return false;
    }
    match status {
        401 | 403 | 405 | 411 | 413 | 414 => true,
        400 => [
            "KeyTooLong",
            "InvalidBucketName",
            "EntityTooLarge",
            "MetadataTooLarge",
            "InvalidArgument",
            "BadDigest",
        ]
        .iter()
        .any(|code| message.contains(code)),
        _ => false,
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
pub(super) fn names_nothing(error: &object_store::Error) -> bool {
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
pub(super) fn http_status(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

/// Whether the origin asked to slow down: S3's SlowDown, or any 503.
pub(super) fn is_slow_down(error: &object_store::Error) -> bool {
    let message = error.to_string();
    message.contains("SlowDown") || http_status(&message) == Some(503)
}

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
