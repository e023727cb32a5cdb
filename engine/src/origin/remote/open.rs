//! Opening an origin URL as an `object_store` store, configured by the environment or a
//! settings file, with hydrant's own time limits over both.

use std::sync::Arc;
use std::time::Duration;

use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::ObjectStore;

use crate::origin::{OriginConfig, StoreSettings};
use crate::{Error, ErrorKind, Result};

/// An origin URL opened: the store for reads, metadata and small PUTs; for object stores, the
/// same store with the upload time limit, for multipart uploads driven part by part; and the
/// path prefix within the container.
pub(in crate::origin) struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub parts: Option<Arc<dyn MultipartStore>>,
    pub prefix: Option<Path>,
    /// For a local folder: the folder the store's paths are under.
    pub folder: Option<std::path::PathBuf>,
    /// For S3: PUTs that carry the writer's checksum.
    pub signed: Option<Arc<super::SignedPuts>>,
}

/// Open the store for an origin URL: configured by the environment's variables, with
/// `settings` over them, or by `settings` alone when they came from a settings file.
pub(in crate::origin) fn open_store(
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
            signed: None,
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
            |timeout: Duration| -> Result<$builder> {
                let mut builder = match settings.from_file {
                    true => $builder::new(),
                    false => $builder::from_env(),
                }
                .with_url(&root);
                for (name, value) in store_settings(url, settings, $endpoint_name)? {
                    builder = builder.with_config(setting(url, &name)?, value);
                }
                Ok(builder.with_retry(retry(timeout)).with_config(
                    $key::Client(object_store::ClientConfigKey::Timeout),
                    limit(timeout),
                ))
            }
        };
    }
    // Each store built for reads and for uploads.
    macro_rules! build_both {
        ($configure:ident) => {
            (
                Arc::new(
                    $configure(config.request_timeout)?
                        .build()
                        .map_err(unavailable)?,
                ),
                Arc::new(
                    $configure(config.upload_timeout)?
                        .build()
                        .map_err(unavailable)?,
                ),
            )
        };
    }
    let mut signed = None;
    let (store, parts): (Arc<dyn ObjectStore>, Arc<dyn MultipartStore>) = match scheme {
        "s3" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let configure = store_builder!(AmazonS3Builder, AmazonS3ConfigKey, "endpoint");
            let upload = configure(config.upload_timeout)?;
            // The upload store's HTTP client (its proxy, certificates and time limit as
            // configured) sends the PUTs that carry a writer's checksum too.
            let parts = if super::signed::may_sign(&upload) {
                let connector = super::signed::Connector::default();
                let parts = Arc::new(
                    upload
                        .with_http_connector(connector.clone())
                        .build()
                        .map_err(unavailable)?,
                );
                signed = connector.client().map(|http| {
                    Arc::new(super::SignedPuts::new(
                        parts.clone(),
                        http,
                        retry(config.upload_timeout),
                    ))
                });
                parts
            } else {
                Arc::new(upload.build().map_err(unavailable)?)
            };
            let store = Arc::new(
                configure(config.request_timeout)?
                    .build()
                    .map_err(unavailable)?,
            );
            (store, parts)
        }
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let configure = store_builder!(GoogleCloudStorageBuilder, GoogleConfigKey, "base_url");
            build_both!(configure)
        }
        "az" => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let configure = store_builder!(MicrosoftAzureBuilder, AzureConfigKey, "endpoint");
            build_both!(configure)
        }
        other => unreachable!("scheme {other} passed check_url"),
    };
    Ok(Opened {
        store,
        parts: Some(parts),
        prefix,
        folder: None,
        signed,
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
