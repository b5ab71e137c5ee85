//! The `object_store:` block of a sink: the configuration reference for
//! the object-store sink (S3, GCS, Azure, files), which writes messages
//! into JSON-lines or Parquet files (or one object each) under a path
//! template, and rolls a file over by records, bytes or age.

use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigProblem, SinkBlock};
use crate::config::claim::location_problems;
use crate::config::{HumanDuration, HumanSize, StoreUrl};

/// Messages written to object storage: into rolling files of JSON lines
/// or Parquet, or one object each.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreSinkConfig {
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
    /// `jsonl` (one JSON object a line: `id`, `key`, `headers`,
    /// `published_at` and the payload, as `payload` when it is JSON, else
    /// as `payload_base64`), `parquet` (columns from `schema`, plus
    /// `sluice_id`, `sluice_key` and `sluice_published_at`) or `raw` (one
    /// object per message, its payload as it is).
    #[serde(default)]
    pub format: ObjectFormat,
    /// `gzip` or `zstd` for `jsonl`; `snappy` or `zstd` for `parquet`.
    /// None by default.
    #[serde(default)]
    pub compression: Option<Compression>,
    /// The objects' path below the store, a template: `{topic}`, `{date}`
    /// (`2026-11-29`), `{year}`, `{month}`, `{day}`, `{hour}`, `{minute}`
    /// (UTC, from the message's `published_at`), `{key}` and
    /// `{header.NAME}`. A file holds only messages of one path; its name is
    /// added after it (`part-<uuid>.parquet`).
    #[serde(default = "default_path")]
    pub path: String,
    /// When a file is closed and uploaded: at `max_records` records,
    /// `max_bytes` bytes (as encoded, before the footer), or `max_age`
    /// after its first record, whichever comes first.
    #[serde(default)]
    pub roll: Roll,
    /// `parquet` only: the columns, a map from a field of the JSON payload
    /// to an Arrow type (`string`, `int32`, `int64`, `float32`, `float64`,
    /// `bool`, `timestamp_ms`, `binary`; base64 in the JSON). A column is
    /// nullable unless written `{type: int64, nullable: false}`.
    #[serde(default)]
    pub schema: BTreeMap<String, SchemaField>,
    /// A write (an upload) stalled this long marks the sink not ready,
    /// naming it, while the store's client keeps retrying.
    #[serde(default = "default_stall")]
    pub stall: HumanDuration,
    /// The most files open at once (one per distinct path); the oldest is
    /// closed to make room.
    #[serde(default = "default_max_open_files")]
    pub max_open_files: NonZeroU32,
}

/// How messages are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ObjectFormat {
    /// JSON lines: one object per message.
    #[default]
    Jsonl,
    /// Parquet, with the columns of `schema`.
    Parquet,
    /// One object per message, the payload as it is.
    Raw,
}

/// A file's compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip (`jsonl`).
    Gzip,
    /// Zstandard (`jsonl`, `parquet`).
    Zstd,
    /// Snappy (`parquet`).
    Snappy,
}

/// The limits that close a file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Roll {
    /// Records per file.
    #[serde(default = "default_max_records")]
    pub max_records: NonZeroU64,
    /// Bytes per file, as encoded.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: HumanSize,
    /// How long a file stays open after its first record.
    #[serde(default = "default_max_age")]
    pub max_age: HumanDuration,
}

impl Default for Roll {
    fn default() -> Self {
        Roll {
            max_records: default_max_records(),
            max_bytes: default_max_bytes(),
            max_age: default_max_age(),
        }
    }
}

/// One Parquet column: a type name, or `{type, nullable}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SchemaField {
    /// A nullable column of this type.
    Type(String),
    /// A column of this type, nullable or not.
    Full {
        /// The Arrow type.
        #[serde(rename = "type")]
        kind: String,
        /// Whether the field may be missing or null (default true).
        #[serde(default = "yes")]
        nullable: bool,
    },
}

impl SchemaField {
    /// The type name as written.
    pub fn kind(&self) -> &str {
        match self {
            SchemaField::Type(kind) | SchemaField::Full { kind, .. } => kind,
        }
    }

    /// Whether a missing or null value is allowed.
    pub fn nullable(&self) -> bool {
        match self {
            SchemaField::Type(_) => true,
            SchemaField::Full { nullable, .. } => *nullable,
        }
    }
}

fn yes() -> bool {
    true
}

/// The Arrow types a column may have.
pub const COLUMN_TYPES: &[&str] = &[
    "string",
    "int32",
    "int64",
    "float32",
    "float64",
    "bool",
    "timestamp_ms",
    "binary",
];

/// The fields a path template may name (and `header.NAME`).
pub const PATH_FIELDS: &[&str] = &[
    "topic", "date", "year", "month", "day", "hour", "minute", "key",
];

/// `{topic}/dt={date}/hour={hour}/`.
pub fn default_path() -> String {
    "{topic}/dt={date}/hour={hour}/".into()
}

/// 10,000.
pub fn default_max_records() -> NonZeroU64 {
    NonZeroU64::new(10_000).unwrap_or(NonZeroU64::MIN)
}

/// 64 MiB.
pub fn default_max_bytes() -> HumanSize {
    HumanSize::mib(64)
}

/// 1 minute.
pub fn default_max_age() -> HumanDuration {
    HumanDuration::secs(60)
}

/// 10 s.
pub fn default_stall() -> HumanDuration {
    HumanDuration::secs(10)
}

/// 16.
pub fn default_max_open_files() -> NonZeroU32 {
    NonZeroU32::new(16).unwrap_or(NonZeroU32::MIN)
}

/// One piece of a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPart {
    /// Text as written.
    Text(String),
    /// A field from [`PATH_FIELDS`].
    Field(&'static str),
    /// `{header.NAME}`: a header's value (lowercase name).
    Header(String),
}

/// Parses a path template into its parts.
///
/// # Errors
///
/// An unknown field, an unclosed `{`, or a `..` segment, for people.
pub fn parse_path(template: &str) -> Result<Vec<PathPart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(PathPart::Text(rest[..open].to_owned()));
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("`{template}`: a `{{` is not closed"))?;
        let name = &after[..close];
        if let Some(header) = name.strip_prefix("header.") {
            if header.is_empty() {
                return Err(format!("`{template}`: `{{header.}}` needs a header name"));
            }
            parts.push(PathPart::Header(header.to_ascii_lowercase()));
        } else if let Some(field) = PATH_FIELDS.iter().find(|f| **f == name) {
            parts.push(PathPart::Field(field));
        } else {
            return Err(format!(
                "`{template}`: `{{{name}}}` is not a path field; use {}, or `{{header.NAME}}`",
                PATH_FIELDS
                    .iter()
                    .map(|f| format!("`{{{f}}}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("`{template}`: a `}}` has no `{{`"));
    }
    if !rest.is_empty() {
        parts.push(PathPart::Text(rest.to_owned()));
    }
    if template
        .split('/')
        .any(|segment| segment == ".." || segment == ".")
    {
        return Err(format!(
            "`{template}`: a path may not have `.` or `..` segments"
        ));
    }
    Ok(parts)
}

impl ObjectStoreSinkConfig {
    /// The parsed `store:`.
    ///
    /// # Errors
    ///
    /// When it is not a store URL (or is `memory://`).
    pub fn store_url(&self) -> Result<StoreUrl, String> {
        match StoreUrl::parse(&self.store)? {
            StoreUrl::Memory(_) => Err(format!(
                "`{}`: a sink's objects must outlive the process; use `file://`, `s3://`, \
                 `gs://` or `az://`",
                self.store
            )),
            url => Ok(url),
        }
    }

    /// The file name's extension for the format and compression.
    pub fn extension(&self) -> &'static str {
        match (self.format, self.compression) {
            (ObjectFormat::Jsonl, Some(Compression::Gzip)) => "jsonl.gz",
            (ObjectFormat::Jsonl, Some(Compression::Zstd)) => "jsonl.zst",
            (ObjectFormat::Jsonl, _) => "jsonl",
            (ObjectFormat::Parquet, _) => "parquet",
            (ObjectFormat::Raw, _) => "",
        }
    }

    fn check_format(&self, problems: &mut Vec<ConfigProblem>) {
        let allowed: &[Compression] = match self.format {
            ObjectFormat::Jsonl => &[Compression::Gzip, Compression::Zstd],
            ObjectFormat::Parquet => &[Compression::Snappy, Compression::Zstd],
            ObjectFormat::Raw => &[],
        };
        if let Some(compression) = self.compression
            && !allowed.contains(&compression)
        {
            let name = |c: &Compression| format!("{c:?}").to_ascii_lowercase();
            let format = format!("{:?}", self.format).to_ascii_lowercase();
            problems.push(ConfigProblem::at(
                &["compression"],
                if allowed.is_empty() {
                    format!("`{format}` writes payloads as they are: it takes no `compression`")
                } else {
                    format!(
                        "`{format}` has no `{}` compression; use {}",
                        name(&compression),
                        allowed
                            .iter()
                            .map(|c| format!("`{}`", name(c)))
                            .collect::<Vec<_>>()
                            .join(" or ")
                    )
                },
            ));
        }
        match self.format {
            ObjectFormat::Parquet if self.schema.is_empty() => problems.push(ConfigProblem::at(
                &["format"],
                "`parquet` needs a `schema:` (a map from payload field to column type, e.g. \
                 `{order_id: string, qty: int64}`)",
            )),
            ObjectFormat::Parquet => {
                for (field, column) in &self.schema {
                    if field.starts_with("sluice_") {
                        problems.push(ConfigProblem::at(
                            &["schema"],
                            format!(
                                "column `{field}`: names starting `sluice_` are the sink's own \
                                 (`sluice_id`, `sluice_key`, `sluice_published_at`)"
                            ),
                        ));
                    }
                    if !COLUMN_TYPES.contains(&column.kind()) {
                        problems.push(ConfigProblem::at(
                            &["schema"],
                            format!(
                                "column `{field}`: `{}` is not a column type; use {}",
                                column.kind(),
                                COLUMN_TYPES
                                    .iter()
                                    .map(|t| format!("`{t}`"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        ));
                    }
                }
            }
            _ if !self.schema.is_empty() => problems.push(ConfigProblem::at(
                &["schema"],
                "`schema` is for `format: parquet` only",
            )),
            _ => {}
        }
    }

    fn check_roll(&self, problems: &mut Vec<ConfigProblem>) {
        if self.roll.max_bytes.bytes() == 0 {
            problems.push(ConfigProblem::at(
                &["roll", "max_bytes"],
                "`max_bytes` must be more than 0 bytes",
            ));
        }
        if self.roll.max_age.get().is_zero() {
            problems.push(ConfigProblem::at(
                &["roll", "max_age"],
                "`max_age` must be longer than 0s",
            ));
        }
        if self.stall.get().is_zero() {
            problems.push(ConfigProblem::at(
                &["stall"],
                "`stall` must be longer than 0s",
            ));
        }
    }
}

impl SinkBlock for ObjectStoreSinkConfig {
    fn kind(&self) -> &'static str {
        "object_store"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        match self.store_url() {
            Ok(url) => {
                for (key, message) in location_problems(
                    &url,
                    self.region.as_deref(),
                    self.endpoint.as_deref(),
                    self.allow_http,
                ) {
                    problems.push(ConfigProblem::at(&[key], message));
                }
            }
            Err(message) => problems.push(ConfigProblem::at(&["store"], message)),
        }
        if let Err(message) = parse_path(&self.path) {
            problems.push(ConfigProblem::at(&["path"], message));
        }
        self.check_format(&mut problems);
        self.check_roll(&mut problems);
        problems
    }

    fn describe(&self) -> String {
        let format = format!("{:?}", self.format).to_ascii_lowercase();
        format!("{} ({format})", self.store.trim_end_matches('/'))
    }

    fn resolve_paths(&mut self, dir: &Path) {
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

    fn config(yaml: &str) -> ObjectStoreSinkConfig {
        serde_saphyr::from_str(yaml).expect("an object_store block")
    }

    fn problem_keys(yaml: &str) -> Vec<(String, String)> {
        config(yaml)
            .check()
            .into_iter()
            .map(|p| (p.path.join("."), p.message))
            .collect()
    }

    #[test]
    fn a_good_block_has_no_problems_and_its_defaults() {
        let c = config(
            "store: s3://lake/raw\nendpoint: http://127.0.0.1:9\nallow_http: true\nformat: parquet\n\
             compression: zstd\nschema: {order_id: string, qty: {type: int64, nullable: false}}\n",
        );
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert_eq!(c.roll.max_records.get(), 10_000);
        assert_eq!(c.roll.max_bytes, HumanSize::mib(64));
        assert!(!c.schema["qty"].nullable());
        assert!(c.schema["order_id"].nullable());
        assert_eq!(c.extension(), "parquet");
        assert_eq!(c.describe(), "s3://lake/raw (parquet)");
    }

    #[test]
    fn bad_values_are_reported_at_their_keys() {
        let found = problem_keys(
            "store: file:///x\nformat: jsonl\ncompression: snappy\npath: '{topic}/{nope}/'\n\
             schema: {a: string}\nroll: {max_bytes: 0}\n",
        );
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["path", "compression", "schema", "roll.max_bytes"],
            "{found:?}"
        );
        assert!(
            found[0].1.contains("`{nope}` is not a path field"),
            "{found:?}"
        );
        assert!(found[1].1.contains("no `snappy`"), "{found:?}");
        let found = problem_keys("store: s3://l\nformat: parquet\nschema: {a: decimal}\n");
        assert!(
            found[0].1.contains("`decimal` is not a column type"),
            "{found:?}"
        );
        let found = problem_keys("store: memory://\n");
        assert_eq!(found[0].0, "store");
        let found = problem_keys("store: file:///x\nendpoint: http://h\n");
        assert_eq!(found[0].0, "endpoint");
    }

    #[test]
    fn path_templates() {
        assert_eq!(
            parse_path("o/{topic}/dt={date}/{header.Tenant}").expect("valid"),
            [
                PathPart::Text("o/".into()),
                PathPart::Field("topic"),
                PathPart::Text("/dt=".into()),
                PathPart::Field("date"),
                PathPart::Text("/".into()),
                PathPart::Header("tenant".into()),
            ]
        );
        assert!(parse_path("{topic").is_err());
        assert!(parse_path("a}").is_err());
        assert!(parse_path("a/../b").is_err());
        assert!(parse_path("{header.}").is_err());
    }
}
