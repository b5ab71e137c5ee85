//! `archive:` blocks (issue 45): an object store that keeps what the
//! runtime is about to remove, in JSON lines, before it removes it.
//!
//! - `dlq: {archive: ...}` on a stage or sink: `dlq purge` writes the
//!   entries it is about to delete (as `dlq show` prints them) and deletes
//!   them only once the object is complete.
//! - `retention: {max_age: 7d, archive: ...}` on a topic: what retention
//!   would drop on the embedded broker is written first (the object-store
//!   sink's JSON lines) and dropped only once the object is complete.
//!
//! The block takes the store fields of the object-store sink and is
//! checked by the same code ([`Archive::sink_config`]); its format is
//! fixed (JSON lines), so it takes only a `path` prefix and a compression.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::connectors::object_store::{
    Compression, ObjectFormat, ObjectStoreSinkConfig, Roll, default_max_open_files, default_stall,
};
use super::{ConfigProblem, SinkBlock, StoreUrl};

/// Where removed messages are kept: an object store, in JSON lines.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Archive {
    /// Where: `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix` or `file:///dir` (a relative `file://dir`
    /// is relative to the pipeline file). Credentials come from the
    /// standard environment variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`).
    pub store: String,
    /// S3 only: the bucket's region (else `AWS_DEFAULT_REGION`/`AWS_REGION`,
    /// else `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// The endpoint URL of an S3-compatible service, a GCS emulator or
    /// Azurite, e.g. `http://127.0.0.1:9000`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Allow a plain `http://` endpoint (local test services).
    #[serde(default)]
    pub allow_http: bool,
    /// A plain prefix below the store (no `{...}` fields). Dead letters go
    /// to `<path>/<pipeline>/<stage>/<date>/<uuid>.jsonl`, what a topic's
    /// retention drops to `<path>/<topic>/<date>/<uuid>.jsonl`.
    #[serde(default)]
    pub path: String,
    /// `gzip` or `zstd`; none by default.
    #[serde(default)]
    pub compression: Option<Compression>,
}

impl Archive {
    /// The block as an object-store sink's, JSON lines: the store fields
    /// are parsed, checked and opened by the sink's own code.
    pub fn sink_config(&self) -> ObjectStoreSinkConfig {
        ObjectStoreSinkConfig {
            store: self.store.clone(),
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            allow_http: self.allow_http,
            format: ObjectFormat::Jsonl,
            compression: self.compression,
            path: String::new(),
            roll: Roll::default(),
            schema: Default::default(),
            stall: default_stall(),
            max_open_files: default_max_open_files(),
        }
    }

    /// The problems of the block, at keys below it: the sink's checks of
    /// the store fields and compression, and a `path` that is a plain
    /// prefix.
    pub fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = self.sink_config().check();
        if self.path.contains(['{', '}']) {
            problems.push(ConfigProblem::at(
                &["path"],
                format!(
                    "`{}`: an archive's `path` is a plain prefix, without `{{...}}` fields \
                     (the runtime adds `<pipeline>/<stage>/<date>/` or `<topic>/<date>/`)",
                    self.path
                ),
            ));
        } else if self
            .path
            .split('/')
            .any(|segment| segment == ".." || segment == ".")
        {
            problems.push(ConfigProblem::at(
                &["path"],
                format!("`{}`: a path may not have `.` or `..` segments", self.path),
            ));
        }
        problems
    }

    /// The store for people and errors: its URL, no credentials (they
    /// come from the environment, never the block).
    pub fn describe(&self) -> String {
        self.store.trim_end_matches('/').to_owned()
    }

    /// The object name below the store for `parts` (`pipeline`, `stage`,
    /// date), named `<uuid>.jsonl[.gz|.zst]`: a fresh UUIDv7, so no two
    /// writes share a name and a create-only put never meets another's.
    pub fn object_key(&self, parts: &[&str], id: &str) -> String {
        let extension = self.sink_config().extension();
        let mut key: Vec<&str> = Vec::new();
        let prefix = self.path.trim_matches('/');
        if !prefix.is_empty() {
            key.push(prefix);
        }
        key.extend(parts.iter().copied());
        format!("{}/{id}.{extension}", key.join("/"))
    }

    /// A relative `file://` store, made relative to the pipeline file's
    /// directory `dir`.
    pub fn resolve_paths(&mut self, dir: &Path) {
        if let Ok(StoreUrl::File(path)) = StoreUrl::parse(&self.store)
            && path.is_relative()
        {
            self.store = StoreUrl::File(dir.join(path)).to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(yaml: &str) -> Archive {
        serde_saphyr::from_str(yaml).expect("an archive block")
    }

    #[test]
    fn an_archive_is_checked_by_the_sinks_code_and_keys_are_fresh() {
        let a = archive("store: s3://lake/dlq\nendpoint: http://127.0.0.1:9\nallow_http: true\n");
        assert!(a.check().is_empty(), "{:?}", a.check());
        assert_eq!(
            a.object_key(&["p", "s", "2026-11-30"], "u"),
            "p/s/2026-11-30/u.jsonl"
        );
        let a = archive("store: file:///x\npath: /keep/\ncompression: gzip\n");
        assert_eq!(a.object_key(&["t", "d"], "u"), "keep/t/d/u.jsonl.gz");
        let keys = |yaml: &str| -> Vec<String> {
            archive(yaml)
                .check()
                .into_iter()
                .map(|p| p.path.join("."))
                .collect()
        };
        assert_eq!(keys("store: ftp://x\n"), ["store"]);
        assert_eq!(
            keys("store: file:///x\ncompression: snappy\n"),
            ["compression"]
        );
        assert_eq!(keys("store: file:///x\npath: '{topic}'\n"), ["path"]);
        assert_eq!(keys("store: file:///x\nendpoint: http://h\n"), ["endpoint"]);
        assert!(serde_saphyr::from_str::<Archive>("store: file:///x\nformat: jsonl\n").is_err());
    }
}
