//! Pipeline files: the YAML model, parsing with positions, environment
//! interpolation, validation and the JSON Schema.
//!
//! A file holds one pipeline; a directory holds one per `*.yaml`/`*.yml`
//! file. [`load`] reads and checks them and returns every problem as a
//! `file:line:col: message` [`Diagnostic`]; [`load_checked`] also runs a
//! [`PipelineCheck`] that needs the runtime (`crate::plugin::PluginCheck`
//! loads each stage's plugin). Config names no other part of the runtime:
//! they read it.
//!
//! - `model`: the structs, which are the configuration reference (with
//!   `dedup`, a stage's `dedup:` block);
//! - `archive`: an `archive:` block (a DLQ's, a topic retention's);
//! - `broker`: the `broker:` field, `embedded` or a NATS URL's options;
//! - `units`: durations (`30s`) and sizes (`64MiB`);
//! - `parse`: bytes -> positioned tree -> typed model, under limits;
//! - `tree`: the positioned tree and a serde `Deserializer` over it;
//! - `interpolate`: `${VAR}`, `${VAR:-default}`, `$$`;
//! - `secrets`: the `secrets:` block and `{secret:name}`;
//! - `state`: a stage's `state:` grant;
//! - `http`: a stage's `http:` grant (outbound HTTP);
//! - `connectors`: the `sources:` and `sinks:` blocks, one file per
//!   connector, with their checks (built by `crate::connect`);
//! - `hidden`: URLs and secrets that are never shown;
//! - `validate`: loading many files and the checks across values;
//! - `diagnostic`: what is reported.

mod archive;
mod broker;
mod claim;
pub mod connectors;
mod dedup;
mod diagnostic;
mod hidden;
mod http;
mod interpolate;
mod model;
mod parse;
mod rate;
pub(crate) mod secrets;
mod state;
mod tree;
mod units;
mod validate;

pub use archive::Archive;
pub use broker::{BadNatsUrl, DEFAULT_DUPLICATE_WINDOW, NatsOptions};
pub use claim::{
    ClaimCheck, StoreUrl, default_claim_retention, default_claim_threshold, default_max_payload,
};
pub use connectors::{
    ConfigProblem, DelayFormat, DelayFrom, SinkBlock, SinkDef, SourceBlock, SourceDef,
};
pub use dedup::{Dedup, DedupKey, LEASE_MARGIN, MissingKey, default_dedup_ttl};
pub use diagnostic::{Diagnostic, Diagnostics};
pub use hidden::{Secret, SecretText, SecretUrl};
pub use http::{AllowedHost, HttpGrant, is_reserved_header};
pub use interpolate::interpolate;
pub use model::*;
pub(crate) use parse::parse_yaml;
pub use parse::{MAX_ALIAS_REPLAY, MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES};
pub use rate::{DEFAULT_MAX_KEYS, Rate, RateForm, RateLimit, rate_short};
pub use secrets::{MAX_SECRET_BYTES, SecretSource, SecretValues, read_spec as read_secret_spec};
pub use state::{DEFAULT_STATE_MAX_BYTES, StateGrant};
pub(crate) use tree::Node;
pub use tree::Pos;
pub use tree::Seg;
pub use units::{HumanDuration, HumanSize};
#[cfg(feature = "fuzz")]
pub(crate) use validate::load_bytes;
pub use validate::{PipelineCheck, load, load_checked, load_with};

/// The JSON Schema of a pipeline file, derived from [`Pipeline`], for
/// editors (`# yaml-language-server: $schema=...`).
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(Pipeline);
    schema.insert(
        "title".into(),
        serde_json::Value::String("Sluice pipeline".into()),
    );
    schema.to_value()
}
