//! The TLS options every connector block has (`tls_ca`, `tls_cert`,
//! `tls_key`): the YAML, paths made absolute against the pipeline file,
//! and the checks `validate` makes (the files exist, a certificate comes
//! with its key). Reading them into a TLS client is `crate::connect::tls`.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigProblem;

/// The TLS options every connector block has, declared once here and
/// flattened into each block (`#[serde(flatten)] tls: TlsOptions`), so
/// the YAML keys stay `tls_ca`, `tls_cert` and `tls_key` beside the
/// block's own. They apply when the block's URL asks for TLS (`rediss://`,
/// `https://`, `sslmode=...`, `amqps://`, ...); `check` refuses them
/// otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct TlsOptions {
    /// A PEM file of CA certificates to trust instead of the system's
    /// roots (relative to the pipeline file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// For a server that requires client certificates (mutual TLS): this
    /// client's certificate chain, leaf first (PEM, relative to the
    /// pipeline file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

impl TlsOptions {
    /// The files, as the TLS code takes them.
    pub fn files(&self) -> TlsFiles<'_> {
        TlsFiles::new(&self.tls_ca, &self.tls_cert, &self.tls_key)
    }

    /// Makes relative paths absolute against `dir`, the pipeline file's
    /// directory.
    pub fn resolve_paths(&mut self, dir: &Path) {
        resolve_all(
            dir,
            [&mut self.tls_ca, &mut self.tls_cert, &mut self.tls_key],
        );
    }
}

/// The TLS files a connector's block names: `tls_ca`, `tls_cert`,
/// `tls_key` (absolute once the pipeline is loaded).
#[derive(Debug, Clone, Copy, Default)]
pub struct TlsFiles<'a> {
    /// CA certificates to trust instead of the system's roots.
    pub ca: Option<&'a Path>,
    /// This client's certificate chain, for mutual TLS.
    pub cert: Option<&'a Path>,
    /// The private key of `cert`.
    pub key: Option<&'a Path>,
}

impl<'a> TlsFiles<'a> {
    /// The files of a block with these three options.
    pub fn new(
        ca: &'a Option<PathBuf>,
        cert: &'a Option<PathBuf>,
        key: &'a Option<PathBuf>,
    ) -> TlsFiles<'a> {
        TlsFiles {
            ca: ca.as_deref(),
            cert: cert.as_deref(),
            key: key.as_deref(),
        }
    }

    /// The first option given, if any (to name it when TLS is off).
    pub fn first_given(&self) -> Option<&'static str> {
        [
            ("tls_ca", self.ca),
            ("tls_cert", self.cert),
            ("tls_key", self.key),
        ]
        .into_iter()
        .find_map(|(name, path)| path.map(|_| name))
    }

    /// The problems with the files (for `validate`): a missing file, a
    /// certificate without its key or the reverse.
    pub fn check(&self, problems: &mut Vec<ConfigProblem>) {
        check_ca(self.ca, problems);
        for (name, path) in [("tls_cert", self.cert), ("tls_key", self.key)] {
            if let Some(path) = path
                && !path.is_file()
            {
                problems.push(ConfigProblem::at(
                    &[name],
                    format!(
                        "file not found: {} (a relative `{name}` path is relative to the \
                         pipeline file)",
                        path.display()
                    ),
                ));
            }
        }
        match (self.cert, self.key) {
            (Some(_), None) => problems.push(ConfigProblem::at(
                &["tls_cert"],
                "`tls_cert` needs `tls_key`, the file with its private key",
            )),
            (None, Some(_)) => problems.push(ConfigProblem::at(
                &["tls_key"],
                "`tls_key` needs `tls_cert`, the certificate it is the key of",
            )),
            _ => {}
        }
    }
}

/// Makes the relative paths among `paths` absolute against the pipeline
/// file's directory.
pub fn resolve_all(dir: &Path, paths: [&mut Option<PathBuf>; 3]) {
    for path in paths {
        resolve_ca(path, dir);
    }
}

/// Makes a relative `tls_ca` absolute against the pipeline file's
/// directory.
pub fn resolve_ca(tls_ca: &mut Option<PathBuf>, dir: &Path) {
    if let Some(path) = tls_ca
        && path.is_relative()
    {
        *path = dir.join(&*path);
    }
}

/// The problem with `tls_ca`, if any: the file is missing.
pub fn check_ca(tls_ca: Option<&Path>, problems: &mut Vec<ConfigProblem>) {
    if let Some(path) = tls_ca
        && !path.is_file()
    {
        problems.push(ConfigProblem::at(
            &["tls_ca"],
            format!(
                "CA file not found: {} (a relative `tls_ca` path is relative to the \
                 pipeline file)",
                path.display()
            ),
        ));
    }
}
