//! A real Azure Blob Storage API for tests: Azurite's blob service
//! (`azurite` from npm, which `cargo xtask setup` installs into
//! `$HOME/.cache/sluice/azurite-<version>`), on a free loopback port with
//! its data in a temporary directory, killed on drop.
//!
//! Azurite serves the well-known development account
//! ([`ACCOUNT`]/[`ACCOUNT_KEY`]) path-style: the account is the first
//! segment of every path (`http://127.0.0.1:PORT/devstoreaccount1/...`).
//!
//! ```no_run
//! let azurite = sluice_harness::azurite::AzuriteServer::start()?;
//! azurite.create_container("lake")?;
//! // store: az://lake, credentials: azurite.env() (emulator mode), or
//! // endpoint: azurite.account_url(), credentials: azurite.account_env()
//! # anyhow::Ok(())
//! ```

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};

use crate::served::{self, Served};

/// The Azurite release `cargo xtask setup` installs.
pub const AZURITE_VERSION: &str = "3.37.0";
/// Azurite's well-known development account.
pub const ACCOUNT: &str = "devstoreaccount1";
/// The key of [`ACCOUNT`]: public, the same in every Azurite (Microsoft's
/// documentation prints it), so no secret.
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The REST API version requests are signed for.
const API_VERSION: &str = "2021-10-04";

/// Where `cargo xtask setup` installs Azurite:
/// `$HOME/.cache/sluice/azurite-<AZURITE_VERSION>`, outside the clone, so
/// a fresh clone (or `git clean`) does not fetch it again.
///
/// # Errors
///
/// When `$HOME` is not set.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("$HOME is not set")?;
    Ok(PathBuf::from(home)
        .join(".cache/sluice")
        .join(format!("azurite-{AZURITE_VERSION}")))
}

/// The `azurite-blob` launcher: `$SLUICE_AZURITE_BLOB`, else the one in
/// [`cache_dir`].
///
/// # Errors
///
/// When neither exists (the message says how to install it).
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SLUICE_AZURITE_BLOB").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let bin = cache_dir()?.join("node_modules/.bin/azurite-blob");
    if !bin.is_file() {
        bail!(
            "Azurite {AZURITE_VERSION} is not installed: {} is missing. Run `cargo xtask setup` \
             (it runs `npm install --prefix {} azurite@{AZURITE_VERSION}`), or set \
             $SLUICE_AZURITE_BLOB to an `azurite-blob` launcher",
            bin.display(),
            cache_dir()?.display()
        );
    }
    Ok(bin)
}

/// A running Azurite blob service.
pub struct AzuriteServer {
    served: Served,
}

impl AzuriteServer {
    /// Starts `azurite-blob` on a free loopback port (with
    /// `--skipApiVersionCheck`, so a client newer than this Azurite is
    /// served, and `--loose`, so headers it does not know are ignored)
    /// and waits until it answers.
    ///
    /// # Errors
    ///
    /// Azurite or Node.js is missing (run `cargo xtask setup`), or the
    /// server does not answer within a minute (the error quotes its log).
    pub fn start() -> anyhow::Result<AzuriteServer> {
        let bin = binary()?;
        let served = Served::start(
            "azurite",
            "is Node.js installed? `cargo xtask setup`",
            |port, dir| {
                let mut command = Command::new(&bin);
                command
                    .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                    .arg("--location")
                    .arg(dir.join("data"))
                    .args(["--skipApiVersionCheck", "--loose"]);
                command
            },
            // Any answer will do: the service is up once it answers.
            |port| signed_request(port, "GET", &format!("/{ACCOUNT}?comp=list"), &[], &[]).is_ok(),
        )?;
        Ok(AzuriteServer { served })
    }

    /// `http://127.0.0.1:<port>`: the blob service, what
    /// `AZURITE_BLOB_STORAGE_URL` takes.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.served.port())
    }

    /// `http://127.0.0.1:<port>/devstoreaccount1`: the account URL, what a
    /// sink's `endpoint:` takes outside emulator mode.
    pub fn account_url(&self) -> String {
        format!("{}/{ACCOUNT}", self.endpoint())
    }

    /// The object_store crate's emulator mode, as its own CI uses it: the
    /// well-known account and key, at [`endpoint`](Self::endpoint).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR".into(), "true".into()),
            ("AZURITE_BLOB_STORAGE_URL".into(), self.endpoint()),
        ]
    }

    /// The account and key as for a real account, for a sink whose
    /// `endpoint:` is [`account_url`](Self::account_url).
    pub fn account_env(&self) -> Vec<(String, String)> {
        vec![
            ("AZURE_STORAGE_ACCOUNT_NAME".into(), ACCOUNT.into()),
            ("AZURE_STORAGE_ACCOUNT_KEY".into(), ACCOUNT_KEY.into()),
        ]
    }

    /// Creates a private container.
    ///
    /// # Errors
    ///
    /// The request failed or was refused.
    pub fn create_container(&self, container: &str) -> anyhow::Result<()> {
        let path = format!("/{ACCOUNT}/{container}?restype=container");
        match self.request("PUT", &path, &[], &[])? {
            (201, _) => Ok(()),
            (status, body) => bail!(
                "creating container {container}: {status} {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// One request signed with the account's Shared Key, returning the
    /// status and body. `path` starts with `/devstoreaccount1` and may
    /// carry a query (whose values are signed as given: keep them free of
    /// `%` escapes). `headers` are extra `x-ms-*` headers.
    ///
    /// # Errors
    ///
    /// The connection failed or the response is malformed.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        signed_request(self.served.port(), method, path, headers, body)
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        self.served.log()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.served.pid()
    }

    /// Pauses the server (SIGSTOP; the launcher is the Node.js process
    /// itself): it keeps what it holds and answers nothing until
    /// [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.served.pause()
    }

    /// Resumes a [`pause`](Self::pause)d server (SIGCONT).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.served.resume()
    }
}

/// [`AzuriteServer::request`] to the server on `port`.
fn signed_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let date = http_date(SystemTime::now());
    let mut ms: Vec<(String, String)> = vec![
        ("x-ms-date".into(), date),
        ("x-ms-version".into(), API_VERSION.into()),
    ];
    ms.extend(
        headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned())),
    );
    ms.sort();
    let authorization = format!(
        "SharedKey {ACCOUNT}:{}",
        shared_key_signature(method, path, body.len(), &ms)?
    );
    ms.push(("authorization".into(), authorization));
    served::request(port, method, path, &ms, body)
}

/// The Shared Key signature of a request (the blob service's string to
/// sign, version 2009-09-19 and later): the standard headers this client
/// sends (only `Content-Length`, empty when 0), the sorted `x-ms-*`
/// headers, and the resource: `/<account><path>` then each query
/// parameter, sorted, as `\nname:value`.
fn shared_key_signature(
    method: &str,
    path_and_query: &str,
    content_length: usize,
    ms_headers: &[(String, String)],
) -> anyhow::Result<String> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let length = if content_length == 0 {
        String::new()
    } else {
        content_length.to_string()
    };
    let mut to_sign = format!("{method}\n\n\n{length}\n\n\n\n\n\n\n\n\n");
    for (name, value) in ms_headers {
        to_sign.push_str(&format!("{name}:{value}\n"));
    }
    to_sign.push_str(&format!("/{ACCOUNT}{path}"));
    let mut params: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    params.sort();
    for (name, value) in params {
        to_sign.push_str(&format!("\n{}:{value}", name.to_ascii_lowercase()));
    }
    let key = BASE64
        .decode(ACCOUNT_KEY)
        .context("decoding the account key")?;
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).context("the account key")?;
    mac.update(to_sign.as_bytes());
    Ok(BASE64.encode(mac.finalize().into_bytes()))
}

/// `t` as an RFC 1123 date (`Mon, 30 Nov 2026 02:52:12 GMT`), what
/// `x-ms-date` takes.
fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // 1970-01-01 was a Thursday.
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let name = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(month - 1) as usize];
    format!("{weekday}, {day:02} {name} {year} {h:02}:{m:02}:{s:02} GMT")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_rfc_1123() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_007_132);
        assert_eq!(http_date(t), "Mon, 30 Nov 2026 02:52:12 GMT");
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    }
}
