//! Opening the cloud object stores that a `store:` URL names, for the
//! claim check and the object-store sink alike: one place that knows
//! each cloud's builder, its credentials from the environment and the
//! block's `region`, `endpoint` and `allow_http`.

use std::sync::Arc;

use object_store::ObjectStore;

use crate::config::StoreUrl;

/// Where and how to reach a cloud store, as a block gives it.
#[derive(Debug, Clone, Copy)]
pub struct Location<'a> {
    /// The parsed `store:`.
    pub url: &'a StoreUrl,
    /// S3's region (else `AWS_DEFAULT_REGION`/`AWS_REGION`, else `us-east-1`).
    pub region: Option<&'a str>,
    /// An S3-compatible service, a GCS emulator or Azurite.
    pub endpoint: Option<&'a str>,
    /// Allow a plain `http://` endpoint.
    pub allow_http: bool,
}

/// The client of a cloud store (`s3://`, `gs://`, `az://`), with its
/// credentials from the standard environment variables (`AWS_*`,
/// `GOOGLE_*`, `AZURE_*`). Nothing is contacted yet. `None` for a store
/// that is not a cloud one (`file://`, `memory://`).
///
/// # Errors
///
/// Options the client refuses (a bad endpoint, credentials it cannot
/// read), said with the store's URL and no secret.
pub fn open_cloud(location: Location<'_>) -> Option<Result<Arc<dyn ObjectStore>, String>> {
    let Location {
        url,
        region,
        endpoint,
        allow_http,
    } = location;
    let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match url {
        StoreUrl::S3 { bucket, .. } => {
            let mut builder =
                object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            if let Some(region) = region {
                builder = builder.with_region(region);
            }
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder
                .with_allow_http(allow_http)
                .build()
                .map(|s| Arc::new(s) as _)
        }
        StoreUrl::Gcs { bucket, .. } => {
            let mut builder =
                object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
            if let Some(endpoint) = endpoint {
                builder = builder.with_url(endpoint);
            }
            builder
                .with_client_options(object_store::ClientOptions::new().with_allow_http(allow_http))
                .build()
                .map(|s| Arc::new(s) as _)
        }
        StoreUrl::Azure { container, .. } => {
            let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_container_name(container);
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint.to_owned());
            }
            builder
                .with_allow_http(allow_http)
                .build()
                .map(|s| Arc::new(s) as _)
        }
        StoreUrl::File(_) | StoreUrl::Memory(_) => return None,
    };
    Some(built.map_err(|e| format!("{url}: {e}")))
}
