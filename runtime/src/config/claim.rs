//! A pipeline's or topic's `claim_check:` block: where large payloads go
//! instead of the broker, and the sizes that decide it.
//!
//! ```yaml
//! claim_check: { store: file://claims, threshold: 256KiB, retention: 7d, max_payload: 256MiB }
//! ```
//!
//! The store URL is checked here (with positions, in `validate.rs`); the
//! stores themselves are opened by `crate::claim`.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;

use super::diagnostic::{Diagnostic, Diagnostics};
use super::model::Pipeline;
use super::parse::{Document, locate};
use super::tree::Seg;
use super::units::{HumanDuration, HumanSize};

/// The claim check: a payload above `threshold` is written to `store` and
/// the broker carries only a reference to it (an empty body and a
/// `sluice-claim` header); consumers get the payload back before their
/// handler runs. Set on a pipeline it applies to all its topics and its
/// dead-letter topics; set on a topic it replaces the pipeline's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimCheck {
    /// Where payloads are stored: `file:///var/lib/sluice/claims` (a
    /// directory; a relative `file://claims` is relative to the pipeline
    /// file's directory, like `plugin:`), `s3://bucket/prefix` (credentials
    /// from the standard `AWS_*` environment variables) or `memory://`
    /// (in-process, lost on exit: for tests).
    pub store: String,
    /// Payloads larger than this are stored in `store`; smaller ones travel
    /// in the broker as they are.
    #[serde(default = "default_claim_threshold")]
    pub threshold: HumanSize,
    /// How long a stored payload is kept at least. A `file://` store's
    /// sweeper removes objects older than this that no pending message or
    /// dead letter references; for S3, set a lifecycle rule (`docs/claim-check.md`).
    #[serde(default = "default_claim_retention")]
    pub retention: HumanDuration,
    /// The largest payload accepted on a claim-checked topic; a larger one
    /// is refused (413 on the HTTP API).
    #[serde(default = "default_max_payload")]
    pub max_payload: HumanSize,
    /// S3 only: the bucket's region (else `AWS_DEFAULT_REGION`/`AWS_REGION`,
    /// else `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// S3 only: the endpoint URL of an S3-compatible service (MinIO, moto,
    /// ...), e.g. `http://127.0.0.1:9000`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// S3 only: allow a plain `http://` endpoint (local test services).
    #[serde(default)]
    pub allow_http: bool,
}

/// 256 KiB (SQS's and the Extended Client's limit).
pub fn default_claim_threshold() -> HumanSize {
    HumanSize(256 << 10)
}

/// 7 days.
pub fn default_claim_retention() -> HumanDuration {
    HumanDuration::secs(7 * 24 * 3600)
}

/// 256 MiB.
pub fn default_max_payload() -> HumanSize {
    HumanSize::mib(256)
}

/// A claim store's location, as parsed from `store:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoreUrl {
    /// A directory on this machine (absolute once loaded).
    File(PathBuf),
    /// An S3 bucket and a key prefix (no leading or trailing `/`; may be empty).
    S3 {
        /// The bucket.
        bucket: String,
        /// The key prefix.
        prefix: String,
    },
    /// A Google Cloud Storage bucket and a key prefix.
    Gcs {
        /// The bucket.
        bucket: String,
        /// The key prefix.
        prefix: String,
    },
    /// An Azure Blob Storage container and a key prefix.
    Azure {
        /// The container.
        container: String,
        /// The key prefix.
        prefix: String,
    },
    /// An in-process store, by name (`memory://` is the name ``).
    Memory(String),
}

impl StoreUrl {
    /// Parses a `store:` value.
    ///
    /// # Errors
    ///
    /// What is wrong with it, for people.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        let text = text.trim();
        if let Some(path) = text.strip_prefix("file://") {
            if path.is_empty() {
                return Err(
                    "`file://` needs a directory, e.g. `file:///var/lib/sluice/claims` or \
                     `file://claims` (relative to the pipeline file)"
                        .into(),
                );
            }
            return Ok(StoreUrl::File(PathBuf::from(path)));
        }
        for (scheme, what) in [
            ("s3://", "bucket"),
            ("gs://", "bucket"),
            ("az://", "container"),
        ] {
            let Some(rest) = text.strip_prefix(scheme) else {
                continue;
            };
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() || !valid_bucket(bucket) {
                return Err(format!(
                    "`{text}`: `{scheme}` needs a {what} name (lowercase letters, digits, `-`,                      `_` and `.`), e.g. `{scheme}my-{what}/prefix`"
                ));
            }
            let (bucket, prefix) = (bucket.to_owned(), prefix.trim_matches('/').to_owned());
            return Ok(match scheme {
                "s3://" => StoreUrl::S3 { bucket, prefix },
                "gs://" => StoreUrl::Gcs { bucket, prefix },
                _ => StoreUrl::Azure {
                    container: bucket,
                    prefix,
                },
            });
        }
        if let Some(name) = text.strip_prefix("memory://") {
            return Ok(StoreUrl::Memory(name.trim_matches('/').to_owned()));
        }
        Err(format!(
            "`{text}` is not a store URL; use `file:///path`, `s3://bucket/prefix`, \
             `gs://bucket/prefix`, `az://container/prefix` or `memory://`"
        ))
    }
}

/// A bucket or container name as the clouds allow it (the strictest of
/// S3's, GCS's and Azure's rules is not needed here: the store says the
/// rest); nothing that would change the URL's meaning.
fn valid_bucket(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
}

impl StoreUrl {
    /// The store's key prefix below its bucket or container (empty for a
    /// directory or memory).
    pub fn prefix(&self) -> &str {
        match self {
            StoreUrl::S3 { prefix, .. }
            | StoreUrl::Gcs { prefix, .. }
            | StoreUrl::Azure { prefix, .. } => prefix,
            StoreUrl::File(_) | StoreUrl::Memory(_) => "",
        }
    }

    /// Whether it is a cloud store (`s3://`, `gs://`, `az://`), which
    /// `endpoint` and `allow_http` apply to.
    pub fn is_cloud(&self) -> bool {
        matches!(
            self,
            StoreUrl::S3 { .. } | StoreUrl::Gcs { .. } | StoreUrl::Azure { .. }
        )
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (scheme, bucket, prefix) = match self {
            StoreUrl::File(path) => return write!(f, "file://{}", path.display()),
            StoreUrl::Memory(name) => return write!(f, "memory://{name}"),
            StoreUrl::S3 { bucket, prefix } => ("s3", bucket, prefix),
            StoreUrl::Gcs { bucket, prefix } => ("gs", bucket, prefix),
            StoreUrl::Azure { container, prefix } => ("az", container, prefix),
        };
        if prefix.is_empty() {
            write!(f, "{scheme}://{bucket}")
        } else {
            write!(f, "{scheme}://{bucket}/{prefix}")
        }
    }
}

impl ClaimCheck {
    /// The parsed `store:`.
    ///
    /// # Errors
    ///
    /// When it is not a store URL.
    pub fn store_url(&self) -> Result<StoreUrl, String> {
        StoreUrl::parse(&self.store)
    }
}

/// Makes a relative `file://` store absolute against `dir` (the pipeline
/// file's directory), as the loader does for `plugin:` paths.
pub(super) fn resolve_relative(claim: &mut ClaimCheck, dir: &Path) {
    if let Ok(StoreUrl::File(path)) = claim.store_url()
        && path.is_relative()
    {
        claim.store = StoreUrl::File(dir.join(path)).to_string();
    }
}

/// Makes the relative `file://` stores of `pipeline` (read from `file`)
/// absolute.
pub(super) fn resolve_paths(pipeline: &mut Pipeline, file: &Path) {
    let dir = file.parent().unwrap_or(Path::new("."));
    if let Some(claim) = &mut pipeline.claim_check {
        resolve_relative(claim, dir);
    }
    for topic in &mut pipeline.topics {
        if let Some(claim) = &mut topic.claim_check {
            resolve_relative(claim, dir);
        }
    }
}

/// Reports the problems of a pipeline's `claim_check:` blocks at their keys.
pub(super) fn check_pipeline(pipeline: &Pipeline, report: &mut impl FnMut(&[Seg<'_>], String)) {
    if let Some(claim) = &pipeline.claim_check {
        for (key, message) in problems(claim) {
            report(&[Seg::Key("claim_check"), Seg::Key(key)], message);
        }
    }
    for (i, topic) in pipeline.topics.iter().enumerate() {
        if let Some(claim) = &topic.claim_check {
            for (key, message) in problems(claim) {
                report(
                    &[
                        Seg::Key("topics"),
                        Seg::Index(i),
                        Seg::Key("claim_check"),
                        Seg::Key(key),
                    ],
                    message,
                );
            }
        }
    }
}

/// A topic declared by several pipelines must have one claim check (the
/// same, or none in all): every publisher and consumer of a topic must
/// agree whether its payloads are offloaded, and where.
pub(super) fn check_shared_topics(docs: &[Document], diagnostics: &mut Diagnostics) {
    let mut seen: std::collections::HashMap<&str, (&Document, Option<&ClaimCheck>)> =
        std::collections::HashMap::new();
    for doc in docs {
        let p = &doc.pipeline;
        for (i, topic) in p.topics.iter().enumerate() {
            let effective = topic.claim_check.as_ref().or(p.claim_check.as_ref());
            match seen.get(topic.name.as_str()) {
                None => {
                    seen.insert(&topic.name, (doc, effective));
                }
                Some((first, theirs)) if *theirs != effective => {
                    let pos = locate(&doc.tree, &[Seg::Key("topics"), Seg::Index(i)]);
                    let describe = |c: Option<&ClaimCheck>| {
                        c.map_or_else(|| "none".to_owned(), |c| format!("`{}`", c.store))
                    };
                    diagnostics.push(Diagnostic {
                        file: p.source.clone(),
                        line: pos.line,
                        col: pos.col,
                        message: format!(
                            "topic `{}` has claim check {} here but {} in pipeline `{}` ({}); a \
                             topic shared by pipelines needs the same `claim_check` in each",
                            topic.name,
                            describe(effective),
                            describe(*theirs),
                            first.pipeline.name,
                            first.pipeline.source.display()
                        ),
                    });
                }
                Some(_) => {}
            }
        }
    }
}

/// The problems of one `claim_check:` block, each with the key it is at.
pub(super) fn problems(claim: &ClaimCheck) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let url = match claim.store_url() {
        Ok(url) => Some(url),
        Err(err) => {
            out.push(("store", err));
            None
        }
    };
    if claim.threshold.bytes() == 0 {
        out.push((
            "threshold",
            "`threshold` must be more than 0 bytes (leave `claim_check:` out for none)".into(),
        ));
    }
    if claim.max_payload < claim.threshold {
        out.push((
            "max_payload",
            format!(
                "`max_payload` ({}) is smaller than `threshold` ({}): nothing could be offloaded",
                claim.max_payload, claim.threshold
            ),
        ));
    }
    if claim.retention.get().is_zero() {
        out.push(("retention", "`retention` must be longer than 0s".into()));
    }
    if let Some(url) = &url {
        out.extend(location_problems(
            url,
            claim.region.as_deref(),
            claim.endpoint.as_deref(),
            claim.allow_http,
        ));
    }
    out
}

/// The problems of a store's location options (`region`, `endpoint`,
/// `allow_http`) for `url`, each with its key: one check for the claim
/// check and the object-store sink, which take the same fields.
pub fn location_problems(
    url: &StoreUrl,
    region: Option<&str>,
    endpoint: Option<&str>,
    allow_http: bool,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let s3 = matches!(url, StoreUrl::S3 { .. });
    if !s3 && region.is_some() {
        out.push(("region", "`region` applies to `s3://` stores only".into()));
    }
    if !url.is_cloud() {
        for (key, set) in [("endpoint", endpoint.is_some()), ("allow_http", allow_http)] {
            if set {
                out.push((
                    key,
                    format!("`{key}` applies to `s3://`, `gs://` and `az://` stores only"),
                ));
            }
        }
    }
    if let Some(endpoint) = endpoint {
        if endpoint.starts_with("http://") {
            if url.is_cloud() && !allow_http {
                out.push((
                    "endpoint",
                    format!("`{endpoint}` is plain HTTP; set `allow_http: true` to use it"),
                ));
            }
        } else if !endpoint.starts_with("https://") {
            out.push((
                "endpoint",
                format!("`{endpoint}` is not an http:// or https:// URL"),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(
            StoreUrl::parse("file:///var/c"),
            Ok(StoreUrl::File("/var/c".into()))
        );
        assert_eq!(
            StoreUrl::parse("s3://b/p/q/"),
            Ok(StoreUrl::S3 {
                bucket: "b".into(),
                prefix: "p/q".into()
            })
        );
        assert_eq!(
            StoreUrl::parse("s3://b"),
            Ok(StoreUrl::S3 {
                bucket: "b".into(),
                prefix: String::new()
            })
        );
        assert_eq!(
            StoreUrl::parse("memory://"),
            Ok(StoreUrl::Memory(String::new()))
        );
        assert!(StoreUrl::parse("s3:///x").is_err());
        assert!(StoreUrl::parse("file://").is_err());
        assert_eq!(
            StoreUrl::parse("gs://b/x"),
            Ok(StoreUrl::Gcs {
                bucket: "b".into(),
                prefix: "x".into()
            })
        );
        assert!(StoreUrl::parse("az://").is_err());
        assert!(StoreUrl::parse("s3://B?x").is_err());
        assert!(StoreUrl::parse("ftp://b").is_err());
        let url = StoreUrl::parse("s3://b/p").expect("valid");
        assert_eq!(url.to_string(), "s3://b/p");
    }

    #[test]
    fn relative_file_stores_follow_the_pipeline_file() {
        let mut claim: ClaimCheck =
            super::super::parse::from_str_for_tests("store: file://claims\n");
        resolve_relative(&mut claim, Path::new("/etc/sluice"));
        assert_eq!(claim.store, "file:///etc/sluice/claims");
        assert_eq!(claim.threshold, HumanSize(256 << 10));
        assert_eq!(claim.retention, HumanDuration::secs(7 * 24 * 3600));
        assert_eq!(claim.max_payload, HumanSize::mib(256));
    }

    #[test]
    fn s3_options_only_on_s3() {
        let claim: ClaimCheck = super::super::parse::from_str_for_tests(
            "store: file:///x\nendpoint: http://h\nthreshold: 2MiB\nmax_payload: 1MiB\n",
        );
        let keys: Vec<&str> = problems(&claim).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["max_payload", "endpoint"]);
        let claim: ClaimCheck = super::super::parse::from_str_for_tests(
            "store: s3://b\nendpoint: http://127.0.0.1:9000\n",
        );
        let found = problems(&claim);
        assert!(found[0].1.contains("allow_http"), "{found:?}");
    }
}
