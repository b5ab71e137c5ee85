//! Opening the cloud object stores that a `store:` URL names, for the
//! claim check and the object-store sink alike: one place that knows
//! each cloud's builder, its credentials from the environment and the
//! block's `region`, `endpoint` and `allow_http`.
//!
//! Each client starts from the `object_store` crate's own `from_env`, so
//! every standard variable works as the crate documents it (`AWS_*`,
//! `GOOGLE_*`, `AZURE_*`), emulators included: Azurite through
//! `AZURE_STORAGE_USE_EMULATOR` and `AZURITE_BLOB_STORAGE_URL`, a GCS
//! emulator through a service-account key with `gcs_base_url` and
//! `disable_oauth` (`GOOGLE_SERVICE_ACCOUNT_KEY`/`GOOGLE_SERVICE_ACCOUNT`).
//! The block's fields are applied on top, and only when set: an
//! `allow_http: false` (the default) does not undo an `*_ALLOW_HTTP` of
//! the environment.

use std::sync::Arc;

use object_store::ClientConfigKey;
use object_store::ObjectStore;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;

use crate::config::StoreUrl;

/// Where and how to reach a cloud store, as a block gives it.
#[derive(Debug, Clone, Copy)]
pub struct Location<'a> {
    /// The parsed `store:`.
    pub url: &'a StoreUrl,
    /// S3's region (else `AWS_DEFAULT_REGION`/`AWS_REGION`, else `us-east-1`).
    pub region: Option<&'a str>,
    /// An S3-compatible service; GCS's base URL (a GCS emulator); Azure's
    /// account URL (for Azurite `http://HOST:PORT/devstoreaccount1`).
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
/// read, an endpoint given while Azurite's emulator mode is on), said
/// with the store's URL and no secret: the crate's builder errors name
/// the option, never a key's value.
pub fn open_cloud(location: Location<'_>) -> Option<Result<Arc<dyn ObjectStore>, String>> {
    let url = location.url;
    let built = match url {
        StoreUrl::S3 { bucket, .. } => open_s3(bucket, location),
        StoreUrl::Gcs { bucket, .. } => open_gcs(bucket, location),
        StoreUrl::Azure { container, .. } => open_azure(container, location),
        StoreUrl::File(_) | StoreUrl::Memory(_) => return None,
    };
    Some(built.map_err(|e| format!("{url}: {e}")))
}

fn open_s3(bucket: &str, location: Location<'_>) -> Result<Arc<dyn ObjectStore>, String> {
    let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some(region) = location.region {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = location.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if location.allow_http {
        builder = builder.with_allow_http(true);
    }
    let store = builder.build().map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

/// GCS: `endpoint` is the base URL every request goes to (the crate's
/// `with_base_url`; without it, a service-account key's `gcs_base_url`,
/// else `https://storage.googleapis.com`).
fn open_gcs(bucket: &str, location: Location<'_>) -> Result<Arc<dyn ObjectStore>, String> {
    let mut builder =
        object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
    if let Some(endpoint) = location.endpoint {
        // The client appends `/<bucket>/<key>`: a trailing `/` would
        // double it.
        builder = builder.with_config(GoogleConfigKey::BaseUrl, endpoint.trim_end_matches('/'));
    }
    if location.allow_http {
        builder = builder.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
    }
    let store = builder.build().map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

/// Azure: `endpoint` is the account URL (the crate's `with_endpoint`);
/// the account and its key come from `AZURE_STORAGE_ACCOUNT_NAME` and
/// `AZURE_STORAGE_ACCOUNT_KEY` (or any other credential the crate
/// reads). In emulator mode (`AZURE_STORAGE_USE_EMULATOR=true`) the crate
/// ignores an endpoint and reads `AZURITE_BLOB_STORAGE_URL`, so both at
/// once are refused rather than one silently dropped.
fn open_azure(container: &str, location: Location<'_>) -> Result<Arc<dyn ObjectStore>, String> {
    let mut builder =
        object_store::azure::MicrosoftAzureBuilder::from_env().with_container_name(container);
    let emulator = builder
        .get_config_value(&AzureConfigKey::UseEmulator)
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"));
    if let Some(endpoint) = location.endpoint {
        if emulator {
            return Err(format!(
                "`endpoint: {endpoint}` is ignored in Azurite's emulator mode \
                 (AZURE_STORAGE_USE_EMULATOR is set): give Azurite's URL (`http://HOST:PORT`) \
                 as AZURITE_BLOB_STORAGE_URL instead, or unset AZURE_STORAGE_USE_EMULATOR and \
                 make `endpoint` the account URL (`http://HOST:PORT/devstoreaccount1` for \
                 Azurite)"
            ));
        }
        builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_owned());
    }
    if location.allow_http {
        builder = builder.with_allow_http(true);
    }
    let store = builder.build().map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}
