//! The object stores the origin tests run against, each a real server on loopback: S3 (moto's
//! server), Azure Blob Storage (Azurite) and Google Cloud Storage (an emulator that speaks GCS's
//! XML API, such as fake-gcs-server). Each is the one CI started (`HYDRANT_TEST_S3_ENDPOINT`,
//! `HYDRANT_TEST_AZURE_ENDPOINT`, `HYDRANT_TEST_GCS_ENDPOINT`), or else, for S3 and Azure, one
//! the test starts and stops itself.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use object_store::{ClientOptions, ObjectStore, ObjectStoreExt};

use super::{eventually, free_port};

/// Azurite's well-known development account and key (public, the same in every install).
pub const AZURE_ACCOUNT: &str = "devstoreaccount1";
const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    S3,
    Gcs,
    Azure,
}

impl Kind {
    /// The variable that names a server CI started.
    fn variable(self) -> &'static str {
        match self {
            Kind::S3 => "HYDRANT_TEST_S3_ENDPOINT",
            Kind::Gcs => "HYDRANT_TEST_GCS_ENDPOINT",
            Kind::Azure => "HYDRANT_TEST_AZURE_ENDPOINT",
        }
    }

    /// The scheme of hydrant's origin URLs for this kind.
    pub fn scheme(self) -> &'static str {
        match self {
            Kind::S3 => "s3",
            Kind::Gcs => "gs",
            Kind::Azure => "az",
        }
    }

    /// A server of this kind on `port`, and how to install it when it is missing; `None` for
    /// GCS, whose emulators that speak the XML API object_store uses (fake-gcs-server) are not
    /// packaged for pip, npm or apt: it must be given by its variable.
    fn command(self, port: u16) -> Option<(Command, &'static str)> {
        let port = port.to_string();
        match self {
            Kind::S3 => {
                let mut command = Command::new("moto_server");
                command.args(["-H", "127.0.0.1", "-p", &port]);
                Some((command, "pip install 'moto[server]'"))
            }
            Kind::Gcs => None,
            Kind::Azure => {
                let mut command = Command::new("azurite-blob");
                command.args([
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    &port,
                    "--inMemoryPersistence",
                    "--disableTelemetry",
                    "--skipApiVersionCheck",
                    "--silent",
                ]);
                Some((command, "npm install -g azurite"))
            }
        }
    }
}

/// A running object store server.
pub struct Store {
    pub kind: Kind,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    child: Option<Child>,
}

/// The S3 server, under the name the S3-only tests know it by.
pub type S3Server = Store;

impl Store {
    /// The S3 server.
    pub fn start() -> Store {
        Store::of(Kind::S3)
    }

    pub fn of(kind: Kind) -> Store {
        if let Ok(endpoint) = std::env::var(kind.variable()) {
            return Store {
                kind,
                endpoint: endpoint.trim_end_matches('/').to_string(),
                child: None,
            };
        }
        let port = free_port();
        let Some((mut command, install)) = kind.command(port) else {
            panic!(
                "no {kind:?} server: set {} to one that speaks the XML API",
                kind.variable()
            )
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "no {kind:?} server: set {} or install one ({install}): {error}",
                    kind.variable()
                )
            });
        let store = Store {
            kind,
            endpoint: format!("http://127.0.0.1:{port}"),
            child: Some(child),
        };
        // Answering a request, not only an open port: the emulators listen before they serve.
        eventually("the object store server to answer", || {
            TcpStream::connect(store.address()).is_ok() && !store.http("GET", "/").is_empty()
        });
        store
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        self.endpoint.trim_start_matches("http://").to_string()
    }

    /// hydrant's origin URL for `path` (a bucket or container, then perhaps a prefix).
    pub fn url(&self, path: &str) -> String {
        format!("{}://{path}", self.kind.scheme())
    }

    /// The path an object store request for `path` (`/bucket/key`) names on the wire: the
    /// account comes first on Azure's path-style URLs.
    pub fn request_path(&self, path: &str) -> String {
        match self.kind {
            Kind::S3 | Kind::Gcs => path.to_string(),
            Kind::Azure => format!("/{AZURE_ACCOUNT}{path}"),
        }
    }

    /// One plain HTTP request; the whole answer (empty when the connection failed).
    pub fn http(&self, method: &str, path: &str) -> String {
        self.http_with(method, path, &[], "")
    }

    fn http_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &str,
    ) -> String {
        let Ok(mut stream) = TcpStream::connect(self.address()) else {
            return String::new();
        };
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.address(),
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        if stream.write_all(request.as_bytes()).is_err() {
            return String::new();
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    }

    /// Create `bucket`, emptied of what an earlier run against the same server left.
    pub fn create_bucket(&self, bucket: &str) {
        let answer = match self.kind {
            // moto accepts unsigned requests.
            Kind::S3 => self.http("PUT", &format!("/{bucket}")),
            // The emulator takes JSON API requests without credentials.
            Kind::Gcs => self.http_with(
                "POST",
                "/storage/v1/b?project=hydrant-tests",
                &[("Content-Type", "application/json".into())],
                &format!("{{\"name\":\"{bucket}\"}}"),
            ),
            Kind::Azure => self.create_container(bucket),
        };
        let created = answer.starts_with("HTTP/1.1 20") || answer.starts_with("HTTP/1.0 20");
        let existed = answer.starts_with("HTTP/1.1 409") || answer.starts_with("HTTP/1.0 409");
        assert!(created || existed, "create bucket {bucket}: {answer}");
        for key in self.list(bucket) {
            self.with_bucket(bucket, |store| async move {
                store.delete(&key.as_str().into()).await.unwrap()
            });
        }
    }

    /// Azure's Create Container, signed with the account's shared key (Azurite refuses
    /// anonymous requests; object_store has no call for it).
    fn create_container(&self, container: &str) -> String {
        use hmac::{Hmac, Mac};
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let version = "2021-08-06";
        // The 12 standard headers (all empty here but the zero length, which is written
        // empty), then the x-ms- headers, then the resource: the account twice on a
        // path-style URL.
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n\
             /{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{container}\nrestype:container"
        );
        let key = base64_simd::STANDARD.decode_to_vec(AZURE_KEY).unwrap();
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
        mac.update(to_sign.as_bytes());
        let signature = base64_simd::STANDARD.encode_to_string(mac.finalize().into_bytes());
        self.http_with(
            "PUT",
            &format!("/{AZURE_ACCOUNT}/{container}?restype=container"),
            &[
                ("x-ms-date", date),
                ("x-ms-version", version.into()),
                (
                    "Authorization",
                    format!("SharedKey {AZURE_ACCOUNT}:{signature}"),
                ),
            ],
            "",
        )
    }

    /// A client of `bucket` on this server directly (not through hydrant or a proxy).
    pub fn client(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        let options = ClientOptions::new().with_allow_http(true);
        match self.kind {
            Kind::S3 => Arc::new(
                object_store::aws::AmazonS3Builder::new()
                    .with_endpoint(&self.endpoint)
                    .with_client_options(options)
                    .with_bucket_name(bucket)
                    .with_region("us-east-1")
                    .with_access_key_id("test")
                    .with_secret_access_key("test")
                    .build()
                    .unwrap(),
            ),
            Kind::Gcs => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::new()
                    .with_service_account_key(gcs_key(&self.endpoint))
                    .with_client_options(options)
                    .with_bucket_name(bucket)
                    .build()
                    .unwrap(),
            ),
            Kind::Azure => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::new()
                    .with_endpoint(format!("{}/{AZURE_ACCOUNT}", self.endpoint))
                    .with_account(AZURE_ACCOUNT)
                    .with_access_key(AZURE_KEY)
                    .with_client_options(options)
                    .with_container_name(bucket)
                    .build()
                    .unwrap(),
            ),
        }
    }

    /// Run `work` with a client of `bucket`.
    fn with_bucket<T, F>(&self, bucket: &str, work: impl FnOnce(Arc<dyn ObjectStore>) -> F) -> T
    where
        F: std::future::Future<Output = T>,
    {
        let store = self.client(bucket);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work(store))
    }

    /// Put an object straight into the server, in one request.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let payload = object_store::PutPayload::from(data.to_vec());
        self.with_bucket(bucket, |store| async move {
            store.put(&key.into(), payload).await.unwrap()
        });
    }

    /// An object's bytes, or `None` when the server has no such object.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        self.with_bucket(bucket, |store| async move {
            match store.get(&key.into()).await {
                Ok(result) => Some(result.bytes().await.unwrap().to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(error) => panic!("{:?} get {bucket}/{key}: {error}", self.kind),
            }
        })
    }

    /// The CRC32C of an object in the server, read as a stream.
    pub fn crc(&self, bucket: &str, key: &str) -> u32 {
        self.with_bucket(bucket, |store| async move {
            use futures::StreamExt;
            let mut stream = store.get(&key.into()).await.unwrap().into_stream();
            let mut crc = 0;
            while let Some(bytes) = stream.next().await {
                crc = crc32c::crc32c_append(crc, &bytes.unwrap());
            }
            crc
        })
    }

    /// Every key in `bucket`, in order.
    pub fn list(&self, bucket: &str) -> Vec<String> {
        self.with_bucket(bucket, |store| async move {
            use futures::StreamExt;
            let mut listing = store.list(None);
            let mut keys = Vec::new();
            while let Some(meta) = listing.next().await {
                keys.push(meta.unwrap().location.to_string());
            }
            keys.sort();
            keys
        })
    }

    /// The environment a hydrant-server needs to use this server as its origin.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.env_via(&self.address())
    }

    /// The environment a hydrant-server needs to use this server as its origin, reached at
    /// `address` (a proxy in front of it).
    pub fn env_via(&self, address: &str) -> Vec<(&'static str, String)> {
        let endpoint = format!("http://{address}");
        match self.kind {
            Kind::S3 => vec![
                ("AWS_ENDPOINT", endpoint),
                ("AWS_ALLOW_HTTP", "true".into()),
                ("AWS_ACCESS_KEY_ID", "test".into()),
                ("AWS_SECRET_ACCESS_KEY", "test".into()),
                ("AWS_REGION", "us-east-1".into()),
            ],
            Kind::Gcs => vec![
                ("GOOGLE_SERVICE_ACCOUNT_KEY", gcs_key(&endpoint)),
                ("GOOGLE_ALLOW_HTTP", "true".into()),
            ],
            Kind::Azure => vec![
                (
                    "AZURE_STORAGE_ENDPOINT",
                    format!("{endpoint}/{AZURE_ACCOUNT}"),
                ),
                ("AZURE_STORAGE_ACCOUNT_NAME", AZURE_ACCOUNT.into()),
                ("AZURE_STORAGE_ACCOUNT_KEY", AZURE_KEY.into()),
                ("AZURE_ALLOW_HTTP", "true".into()),
            ],
        }
    }
}

impl Store {
    /// The endpoint a bucket's `endpoint=` option names to reach this server at `address`.
    pub fn endpoint_via(&self, address: &str) -> String {
        match self.kind {
            Kind::S3 | Kind::Gcs => format!("http://{address}"),
            Kind::Azure => format!("http://{address}/{AZURE_ACCOUNT}"),
        }
    }

    /// A settings file (`settings=FILE`) with this server's credentials, by object_store's
    /// names.
    pub fn settings_file(&self) -> String {
        match self.kind {
            Kind::S3 => "aws_access_key_id=test\naws_secret_access_key=test\naws_region=us-east-1\n"
                .to_string(),
            Kind::Gcs => format!(
                "google_service_account_key={}\n",
                gcs_key(&self.endpoint)
            ),
            Kind::Azure => format!(
                "azure_storage_account_name={AZURE_ACCOUNT}\nazure_storage_account_key=\"{AZURE_KEY}\"\n"
            ),
        }
    }
}

/// A service account key that points object_store's GCS client at `endpoint` without OAuth (as
/// for any GCS emulator).
fn gcs_key(endpoint: &str) -> String {
    format!(
        "{{\"gcs_base_url\":\"{endpoint}\",\"disable_oauth\":true,\"client_email\":\"\",\
         \"private_key\":\"\",\"private_key_id\":\"\"}}"
    )
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
