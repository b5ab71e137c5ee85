//! Reading one pipeline file: bytes -> positioned tree -> interpolated tree
//! -> typed [`Pipeline`], every failure as `(line, col, message)`.
//!
//! # The YAML parser: serde-saphyr
//!
//! `serde_yaml` is unmaintained and `serde_yml` unsound. Of the two
//! maintained candidates we read:
//!
//! - `serde_norway` is a fork of `serde_yaml` on `unsafe-libyaml` (C
//!   translated to unsafe Rust); it caps recursion at 128 and alias
//!   expansion, and reports positions, but keeps serde_yaml's design.
//! - `serde-saphyr` is built on a pure-Rust parser (`granit-parser`, a
//!   saphyr-parser fork), forbids `unsafe`, is fuzzed and panic-free, and has
//!   an explicit [`serde_saphyr::Budget`]: depth, node, event, alias and
//!   anchor-replay limits that stop billion-laughs and deep nesting with an
//!   error carrying a location. Its `Spanned<T>` gives each value's line and
//!   column, which is what semantic errors need. It rejects duplicate keys by
//!   default.
//!
//! We use serde-saphyr, once per file, to build a positioned tree
//! ([`super::tree::Node`]) under a tight budget; the typed model is then
//! deserialized from that tree by our own small `Deserializer`, so serde
//! errors (unknown field, wrong type, bad duration) and semantic errors use
//! the same positions. (Its own `${...}` "properties" feature only expands
//! plain scalars, so a quoted `"${HOST}"` would stay literal; see
//! `interpolate.rs` for ours.)
//!
//! # Limits
//!
//! A pipeline file is small. Anything past these limits is refused with an
//! error at the offending place, long before it costs time or memory:
//! [`MAX_FILE_BYTES`], nesting deeper than [`MAX_DEPTH`], more than
//! [`MAX_NODES`] nodes, and aliases that would replay more than
//! [`MAX_ALIAS_REPLAY`] events (a "billion laughs" document).

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;
use serde_saphyr::{Localizer, Location};

use super::interpolate::interpolate_tree;
use super::model::{Delivery, Pipeline, Stage};
use super::tree::{DeError, Kind, Node, Pos, Seg, noting_resolved};
use super::{SinkDef, SourceDef};

/// The largest pipeline file accepted: 1 MiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The deepest nesting of lists and mappings accepted.
pub const MAX_DEPTH: usize = 32;
/// The most nodes (scalars, lists, mappings) in one file.
pub const MAX_NODES: usize = 100_000;
/// The most parser events aliases may replay in one file.
pub const MAX_ALIAS_REPLAY: usize = 10_000;

/// A parsed file: the pipeline and the tree it came from, kept for the
/// positions of semantic errors.
#[derive(Debug)]
pub(crate) struct Document {
    pub pipeline: Pipeline,
    pub tree: Node,
}

/// A problem at a position in the file being read.
pub(crate) type Problem = (Pos, String);

/// Reads and parses `path`, looking variables up with `env` (secret files
/// are relative to its directory).
pub(crate) fn read_file(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Document, Vec<Problem>> {
    let start = Pos { line: 1, col: 1 };
    let file = std::fs::File::open(path)
        .map_err(|e| vec![(start, format!("cannot read the pipeline file: {e}"))])?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| vec![(start, format!("cannot read the pipeline file: {e}"))])?;
    parse_bytes(bytes, path.parent().unwrap_or(Path::new(".")), env)
}

/// Parses a pipeline file's bytes: refused when larger than
/// `MAX_FILE_BYTES` or not UTF-8, each at the place it goes wrong.
pub(crate) fn parse_bytes(
    bytes: Vec<u8>,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Document, Vec<Problem>> {
    let start = Pos { line: 1, col: 1 };
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(vec![(
            start,
            format!(
                "the file is larger than {} KiB; a pipeline file should be a few KiB \
                 (split large setups into one file per pipeline in a directory)",
                MAX_FILE_BYTES >> 10
            ),
        )]);
    }
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let text = String::from_utf8_lossy(valid);
            let line = text.matches('\n').count() as u64 + 1;
            let col = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u64 + 1;
            return Err(vec![(
                Pos { line, col },
                "the file is not valid UTF-8 text".into(),
            )]);
        }
    };
    parse_str(&text, dir, env)
}

/// Parses the text of a pipeline file whose directory is `dir`.
pub(crate) fn parse_str(
    text: &str,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Document, Vec<Problem>> {
    let mut tree = parse_tree(text).map_err(|p| vec![p])?;
    match &tree.kind {
        Kind::Map(_) => {}
        Kind::Null => {
            return Err(vec![(
                Pos { line: 1, col: 1 },
                "the file has no pipeline in it; a pipeline file is a mapping with at least \
                 `name:` and `stages:`"
                    .into(),
            )]);
        }
        _ => {
            return Err(vec![(
                tree.pos,
                format!(
                    "a pipeline file must be a mapping (`name: ...`, `topics: ...`, \
                     `stages: ...`), not {}; one file holds one pipeline",
                    tree.type_name()
                ),
            )]);
        }
    }
    let mut problems = Vec::new();
    interpolate_tree(&mut tree, env, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    resolve_delivery_scalars(&mut tree);
    let secrets = super::secrets::read_block(&tree, dir, env)?;
    match super::secrets::with_values(secrets.clone(), || Pipeline::deserialize(&tree)) {
        Ok(mut pipeline) => {
            pipeline.secret_values = secrets;
            mark_written_config(&tree, &mut pipeline);
            Ok(Document { pipeline, tree })
        }
        Err(first) => Err(all_serde_problems(&tree, first)),
    }
}

/// Notes, on each stage's `config:` value that came from `${VAR}`, the
/// text as written: that is what is shown of it.
fn mark_written_config(tree: &Node, pipeline: &mut Pipeline) {
    let Some(Kind::Seq(stages)) = field(tree, "stages").map(|n| &n.kind) else {
        return;
    };
    for (node, stage) in stages.iter().zip(pipeline.stages.iter_mut()) {
        let Some(Kind::Map(entries)) = field(node, "config").map(|n| &n.kind) else {
            continue;
        };
        for (key, value) in entries {
            if let (Some(written), Some(config)) = (&value.written, stage.config.get_mut(&key.name))
            {
                config.written = Some(written.clone());
            }
        }
    }
    // The headers of a stage's `http:` grant, likewise.
    for (node, stage) in stages.iter().zip(pipeline.stages.iter_mut()) {
        let (Some(Kind::Map(hosts)), Some(grant)) = (
            field(node, "http")
                .and_then(|h| field(h, "headers"))
                .map(|n| &n.kind),
            stage.http.as_mut(),
        ) else {
            continue;
        };
        for (host, headers) in hosts {
            let (Kind::Map(headers), Some(granted)) =
                (&headers.kind, grant.headers.get_mut(&host.name))
            else {
                continue;
            };
            for (name, value) in headers {
                if let (Some(written), Some(text)) = (&value.written, granted.get_mut(&name.name)) {
                    text.written.clone_from(written);
                }
            }
        }
    }
}

/// The value of key `name` of mapping `node`.
fn field<'a>(node: &'a Node, name: &str) -> Option<&'a Node> {
    match &node.kind {
        Kind::Map(entries) => entries.iter().find(|(k, _)| k.name == name).map(|(_, v)| v),
        _ => None,
    }
}

/// Serde stops at the first error. To report more than one, each stage is
/// also deserialized on its own, so one bad field per stage shows up.
fn all_serde_problems(tree: &Node, first: DeError) -> Vec<Problem> {
    let mut problems = vec![problem(tree, first)];
    if let Kind::Map(entries) = &tree.kind
        && let Some((_, stages)) = entries.iter().find(|(k, _)| k.name == "stages")
        && let Kind::Seq(stages) = &stages.kind
    {
        for stage in stages {
            if let Err(e) = Stage::deserialize(stage) {
                let p = problem(stage, e);
                if !problems.contains(&p) {
                    problems.push(p);
                }
            }
        }
    }
    for problem in &mut problems {
        at_flattened_value(tree, problem);
        at_delivery_value(tree, problem);
        with_allowed_keys(tree, problem);
    }
    // serde reads a stage's or sink's delivery keys after its other keys
    // (a flattened part last), so an error among them that came first in
    // the file could be hidden by a later one: each is added.
    for (_, item) in stages_and_sinks(tree) {
        if let Err(e) = Delivery::deserialize(item) {
            let p = problem(item, e);
            if !problems.contains(&p) {
                problems.push(p);
            }
        }
    }
    problems.sort_by_key(|(pos, _)| *pos);
    problems
}

/// An error in a part a connector block flattens in (its connection
/// struct's `url`, its `tls_ca`) falls back to the block's position:
/// serde buffers a flattened part's values without positions. Such a
/// problem is moved to the value, by reading each of the block's
/// flattened parts again on its own from the block's positioned YAML:
/// the same error, now stamped where it is. serde words a few errors in
/// buffered values its own way (an enum given a number: "expected string
/// or map"); a problem at the block that is not a missing key is then the
/// first part's error, in the part's words.
fn at_flattened_value(tree: &Node, problem: &mut Problem) {
    use super::connectors::FLATTENED_PARTS;
    let blocks = [("sources", SourceDef::KINDS), ("sinks", SinkDef::KINDS)]
        .into_iter()
        .filter_map(|(list, kinds)| match field(tree, list).map(|n| &n.kind) {
            Some(Kind::Seq(items)) => Some(items.iter().map(move |item| (item, kinds))),
            _ => None,
        })
        .flatten()
        .flat_map(|(item, kinds)| {
            kinds
                .iter()
                .filter_map(move |kind| field(item, kind).map(|block| (*kind, block)))
        })
        .filter(|(_, block)| block.pos == problem.0 && matches!(block.kind, Kind::Map(_)));
    for (kind, block) in blocks {
        let errors: Vec<Problem> = FLATTENED_PARTS
            .iter()
            .filter(|(kinds, _)| kinds.is_none_or(|k| k == kind))
            .filter_map(|(_, read)| match read(block) {
                Err(DeError {
                    pos: Some(pos),
                    message,
                }) if pos != block.pos => Some((pos, message)),
                _ => None,
            })
            .collect();
        let same = errors.iter().find(|(_, message)| *message == problem.1);
        let reworded = errors
            .first()
            .filter(|_| !problem.1.starts_with("missing required field"));
        if let Some(found) = same.or(reworded) {
            *problem = found.clone();
            return;
        }
    }
}

/// The stages and sinks of a pipeline file: the mappings that flatten
/// in a [`Delivery`], with the list they sit in.
fn stages_and_sinks(tree: &Node) -> impl Iterator<Item = (&'static str, &Node)> {
    ["stages", "sinks"]
        .into_iter()
        .filter_map(|list| match field(tree, list).map(|n| &n.kind) {
            Some(Kind::Seq(items)) => Some(items.iter().map(move |item| (list, item))),
            _ => None,
        })
        .flatten()
        .filter(|(_, item)| matches!(item.kind, Kind::Map(_)))
}

/// serde reads the [`Delivery`] keys of a stage or sink through a buffer
/// of plain values, where an interpolated `${N}` stays a string and fails
/// a numeric field. Each one's keys are read alone first, and the strings
/// read there as numbers or booleans are made so in the tree.
fn resolve_delivery_scalars(tree: &mut Node) {
    let Kind::Map(entries) = &mut tree.kind else {
        return;
    };
    for (key, list) in entries {
        if let ("stages" | "sinks", Kind::Seq(items)) = (key.name.as_str(), &mut list.kind) {
            for item in items {
                let (_, positions) = noting_resolved(|| Delivery::deserialize(&*item));
                item.resolve_at(&positions);
            }
        }
    }
}

/// An error in a stage's or sink's delivery keys falls back to the
/// mapping's position, as in a connector block's flattened part (see
/// [`at_flattened_value`]), and its words may differ from those of the
/// same key read alone (a plain buffered `30` is not the `30` a duration
/// says has no unit). Such a problem is the [`Delivery`] read as serde
/// reads it flattened in; it is replaced by the error of the part read
/// alone from the positioned YAML (ignoring the other keys), where it is.
fn at_delivery_value(tree: &Node, problem: &mut Problem) {
    /// A [`Delivery`] read as a stage or a sink reads it.
    #[derive(Deserialize)]
    struct Flattened {
        #[serde(flatten)]
        _delivery: Delivery,
    }
    for (_, item) in stages_and_sinks(tree).filter(|(_, item)| item.pos == problem.0) {
        if let Err(flattened) = Flattened::deserialize(item)
            && flattened.message == problem.1
            && let Err(alone) = Delivery::deserialize(item)
        {
            *problem = self::problem(item, alone);
            return;
        }
    }
}

/// serde finds a stage's or sink's unknown key only after its flattened
/// [`Delivery`] took its own, and then says only `unknown field `x``
/// (the tree marks it as a connector block's): the message lists the
/// keys a stage or a sink allows, as for any other mapping.
fn with_allowed_keys(tree: &Node, problem: &mut Problem) {
    for (list, item) in stages_and_sinks(tree) {
        let Kind::Map(entries) = &item.kind else {
            continue;
        };
        let Some((key, _)) = entries.iter().find(|(key, _)| key.pos == problem.0) else {
            continue;
        };
        if !problem
            .1
            .starts_with(&format!("unknown field `{}`;", key.name))
        {
            continue;
        }
        let schema = match list {
            "stages" => schemars::schema_for!(Stage),
            _ => schemars::schema_for!(SinkDef),
        };
        let allowed: Vec<String> = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().map(|k| format!("`{k}`")).collect())
            .unwrap_or_default();
        problem.1 = format!(
            "unknown field `{}`; the fields allowed here are {}",
            key.name,
            allowed.join(", ")
        );
        return;
    }
}

fn problem(node: &Node, e: DeError) -> Problem {
    (e.pos.unwrap_or(node.pos), e.message)
}

/// Plain messages: the position goes in front, as `file:line:col:`.
struct NoLocationSuffix;

impl Localizer for NoLocationSuffix {
    fn attach_location<'a>(&self, base: Cow<'a, str>, _: Location) -> Cow<'a, str> {
        base
    }
    fn alias_defined_at(&self, _: Location) -> String {
        String::new()
    }
    fn alias_used_at(&self, _: Location) -> String {
        String::new()
    }
}

fn parse_tree(text: &str) -> Result<Node, Problem> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            max_nodes: MAX_NODES,
            max_events: 4 * MAX_NODES,
            max_documents: 1,
            max_inclusion_depth: 0,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_ALIAS_REPLAY,
        },
        strict_booleans: true,
    };
    serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| {
        let pos = e
            .location()
            .filter(|l| l.line() > 0)
            .map_or(Pos { line: 1, col: 1 }, |l| Pos {
                line: l.line(),
                col: l.column().max(1),
            });
        let formatter = serde_saphyr::UserMessageFormatter.with_localizer(&NoLocationSuffix);
        let message = e.render_with_options(serde_saphyr::render_options! {
            formatter: &formatter,
            snippets: serde_saphyr::SnippetMode::Off,
        });
        (pos, explain_syntax_error(&message))
    })
}

/// Adds what to do to the parser's terser messages.
fn explain_syntax_error(message: &str) -> String {
    let message = message.trim().trim_start_matches("error: ").to_owned();
    if message.contains("Depth") || message.contains("recursion limit") {
        format!(
            "nesting is deeper than {MAX_DEPTH} levels ({message}); a pipeline file needs only a few"
        )
    } else if message.contains("replayed") || message.contains("alias") && message.contains("limit")
    {
        format!(
            "aliases expand to too much ({message}); anchors and aliases may be used to share \
             small blocks, not to multiply a document"
        )
    } else if message.contains("Documents") {
        "a pipeline file holds one YAML document; put each pipeline in its own file (a \
         directory of files loads them all)"
            .into()
    } else if message.contains("reference to unknown value") || message.contains("unknown anchor") {
        format!("{message}: an alias `*name` needs an anchor `&name` defined before it")
    } else if message.contains("too large or too complex") {
        format!("the document is too large or complex for a pipeline file ({message})")
    } else {
        message
    }
}

/// Parses a YAML document of another kind than a pipeline (a test-cases
/// file), under the same limits and with the same positioned errors, with
/// no `${...}` interpolation.
pub(crate) fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<(T, Node), Problem> {
    let tree = parse_tree(text)?;
    match T::deserialize(&tree) {
        Ok(value) => Ok((value, tree)),
        Err(e) => Err(problem(&tree, e)),
    }
}

/// The position of `path` in a parsed document.
pub(crate) fn locate(tree: &Node, path: &[Seg<'_>]) -> Pos {
    tree.locate(path)
}

/// Deserializes `T` from YAML text through the tree, for unit tests.
#[cfg(test)]
pub(crate) fn from_str_for_tests<T: serde::de::DeserializeOwned>(text: &str) -> T {
    let tree = parse_tree(text).unwrap_or_else(|e| panic!("{e:?}"));
    T::deserialize(&tree).unwrap_or_else(|e| panic!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn errors(text: &str) -> Vec<String> {
        match parse_str(text, Path::new("."), &no_env) {
            Ok(_) => Vec::new(),
            Err(problems) => problems
                .into_iter()
                .map(|(p, m)| format!("{}:{}: {m}", p.line, p.col))
                .collect(),
        }
    }

    const GOOD: &str = "name: p\ntopics: [a, b]\nstages:\n  - name: s\n    subscribe: a\n    plugin: x.wasm\n    publish: [b]\n";

    #[test]
    fn a_good_file_parses() {
        let doc = parse_str(GOOD, Path::new("."), &no_env).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(doc.pipeline.name, "p");
        assert_eq!(doc.pipeline.topics.len(), 2);
        assert_eq!(doc.pipeline.broker, "embedded");
        assert_eq!(
            locate(
                &doc.tree,
                &[
                    Seg::Key("stages"),
                    Seg::Index(0),
                    Seg::Key("publish"),
                    Seg::Index(0)
                ]
            ),
            Pos { line: 7, col: 15 }
        );
    }

    #[test]
    fn serde_errors_point_at_the_node() {
        let text = GOOD.replace("    publish: [b]\n", "    publsh: [b]\n");
        let errs = errors(&text);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("7:5: unknown field `publsh`"),
            "{errs:?}"
        );
        assert!(errs[0].contains("`publish`"), "{errs:?}");

        let errs = errors(&GOOD.replace("plugin: x.wasm", "plugin: x.wasm\n    ack_wait: 30"));
        assert!(errs[0].starts_with("7:15: `30` has no unit"), "{errs:?}");

        let errs = errors("name: p\nstages: 3\n");
        assert!(errs[0].starts_with("2:9: "), "{errs:?}");
    }

    #[test]
    fn an_error_in_a_flattened_part_points_at_its_value() {
        let block = "name: p\ntopics: [a]\nsinks:\n  - name: out\n    subscribe: a\n    redis:\n      \
                     url: rediss://h:6380/0\n      tls_ca: [1]\n      stream: s\n";
        let errs = errors(block);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("8:15: expected path string"),
            "{errs:?}"
        );
        // A block-level error stays at the block.
        let errs = errors(&block.replace("      stream: s\n", ""));
        assert!(
            errs[0].starts_with("7:7: missing required field `stream`"),
            "{errs:?}"
        );
    }

    #[test]
    fn an_error_in_a_connection_field_points_at_its_value() {
        // Each connector's connection struct is flattened into its source
        // and sink blocks: a bad value in it is reported where it is, in
        // the words a plain field gets.
        let cases: [(&str, &str, &[&str], &str, &str); 9] = [
            (
                "sinks",
                "redis",
                &["stream: s"],
                "url: [1]",
                "expected a string",
            ),
            (
                "sources",
                "redis",
                &["stream: s", "group: g"],
                "url: [1]",
                "expected a string",
            ),
            (
                "sinks",
                "nats",
                &["subject: s", "url: nats://h:4222"],
                "creds: [1]",
                "expected path string",
            ),
            (
                "sources",
                "mqtt",
                &["topic: t"],
                "url: [1]",
                "expected a string",
            ),
            (
                "sinks",
                "mqtt",
                &["topic: t", "url: mqtt://h:1883"],
                "keep_alive: 5",
                "`5` has no unit",
            ),
            (
                "sources",
                "postgres",
                &["outbox: o", "url: postgres://u@h/db"],
                "statement_timeout: 5",
                "`5` has no unit",
            ),
            (
                "sinks",
                "sqs",
                &["queue_url: http://h/1/q"],
                "region: [1]",
                "expected a string",
            ),
            (
                "sources",
                "kafka",
                &["topic: t", "group: g", "brokers: h:9092"],
                "security: 5",
                "expected enum Security",
            ),
            (
                "sinks",
                "amqp",
                &["exchange: x", "routing_key: k"],
                "url: [1]",
                "expected a string",
            ),
        ];
        for (list, kind, fields, bad, expected) in cases {
            let to = if list == "sinks" { "subscribe" } else { "to" };
            let mut text =
                format!("name: p\ntopics: [a]\n{list}:\n  - name: x\n    {to}: a\n    {kind}:\n");
            for line in fields.iter().chain([&bad]) {
                text.push_str(&format!("      {line}\n"));
            }
            let key = bad.split(':').next().unwrap_or_default();
            let at = format!("{}:{}: {expected}", 7 + fields.len(), 7 + key.len() + 2);
            let errs = errors(&text);
            assert_eq!(errs.len(), 1, "{kind} {list}: {errs:?}");
            assert!(
                errs[0].starts_with(&at),
                "{kind} {list}: {errs:?}, not {at}"
            );
        }
    }

    #[test]
    fn interpolated_values_reach_a_flattened_connection() {
        use crate::config::connectors::mqtt::Version;
        let text = "name: p\ntopics: [a]\nsources:\n  - name: in\n    to: a\n    mqtt:\n      \
                    topic: t\n      url: ${URL:-mqtt://h:1883}\n      version: ${V:-3.1.1}\n      \
                    keep_alive: ${K:-10s}\n      username: ${U:-5}\n";
        let doc = parse_str(text, Path::new("."), &no_env).unwrap_or_else(|e| panic!("{e:?}"));
        let Some(mqtt) = &doc.pipeline.sources[0].mqtt else {
            panic!("an mqtt source");
        };
        let connection = &mqtt.connection;
        assert_eq!(connection.url.to_string(), "mqtt://h:1883");
        assert_eq!(connection.version, Version::V311);
        assert_eq!(
            connection.keep_alive.get(),
            std::time::Duration::from_secs(10)
        );
        // A number-like value stays text where text is wanted.
        assert_eq!(connection.username.as_deref(), Some("5"));
        let five = text.replace("${V:-3.1.1}", "${V:-5}");
        let doc = parse_str(&five, Path::new("."), &no_env).unwrap_or_else(|e| panic!("{e:?}"));
        let version = doc.pipeline.sources[0]
            .mqtt
            .as_ref()
            .map(|m| m.connection.version);
        assert_eq!(version, Some(Version::V5));
    }

    #[test]
    fn interpolated_values_become_numbers_where_numbers_are_wanted() {
        let text = GOOD.replace("plugin: x.wasm", "plugin: x.wasm\n    concurrency: ${N:-4}");
        let doc = parse_str(&text, Path::new("."), &no_env).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(doc.pipeline.stages[0].delivery.concurrency.get(), 4);
        let errs = errors(&GOOD.replace("x.wasm", "${PLUGIN_DIR}/x.wasm"));
        assert!(
            errs[0].starts_with("6:13: environment variable `PLUGIN_DIR` is not set"),
            "{errs:?}"
        );
    }

    const SINK: &str = "name: p\ntopics: [a]\nsinks:\n  - name: out\n    subscribe: a\n    \
                        redis: {url: \"redis://h:6379\", stream: s}\n";

    #[test]
    fn an_error_in_a_delivery_key_points_at_its_value() {
        let stage = |extra: &str| errors(&format!("{GOOD}{extra}"));
        let errs = stage("    retry: {max_attempts: 0}\n");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("8:27: the number 0 is not allowed"),
            "{errs:?}"
        );
        let errs = stage("    concurrency: -1\n");
        assert!(
            errs[0].starts_with("8:18: the number -1 is not allowed"),
            "{errs:?}"
        );
        let errs = errors(&format!("{SINK}    batch: {{max: x}}\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("7:18: expected a whole number"),
            "{errs:?}"
        );
        // One before a stage's own bad key in the file is not hidden by it
        // (serde reads the delivery keys last).
        let errs = stage("    ack_wait: forever\n    memory: lots\n");
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("8:15: `forever` is not a valid duration"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with("9:13: `lots` is not a valid size"),
            "{errs:?}"
        );
    }

    #[test]
    fn an_unknown_stage_or_sink_key_lists_the_allowed_ones() {
        let errs = errors(&format!("{GOOD}    concurency: 2\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                "8:5: unknown field `concurency`; the fields allowed here are `ack_wait`, "
            ),
            "{errs:?}"
        );
        assert!(
            errs[0].contains("`concurrency`") && errs[0].contains("`plugin`"),
            "{errs:?}"
        );
        let errs = errors(&format!("{SINK}    retri: {{}}\n"));
        assert!(
            errs[0].starts_with(
                "7:5: unknown field `retri`; the fields allowed here are `ack_wait`, "
            ),
            "{errs:?}"
        );
        assert!(
            errs[0].contains("`retry`") && errs[0].contains("`redis`"),
            "{errs:?}"
        );
        assert!(!errs[0].contains("`plugin`"), "{errs:?}");
    }

    #[test]
    fn interpolated_delivery_numbers_are_numbers() {
        let env = |name: &str| (name == "N").then(|| "4".to_owned());
        let keys = "    concurrency: ${N}\n    max_ack_pending: ${N}\n    retry:\n      \
                    max_attempts: ${N}\n    batch: {max: \"${N}\", wait: 10ms}\n";
        let doc = parse_str(&format!("{GOOD}{keys}"), Path::new("."), &env)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let delivery = &doc.pipeline.stages[0].delivery;
        assert_eq!(delivery.concurrency.get(), 4);
        assert_eq!(delivery.max_ack_pending, Some(4));
        assert_eq!(delivery.retry.max_attempts.map(|n| n.get()), Some(4));
        let doc = parse_str(&format!("{SINK}{keys}"), Path::new("."), &env)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(doc.pipeline.sinks[0].delivery.max_ack_pending, Some(4));
        assert_eq!(
            doc.pipeline.sinks[0]
                .delivery
                .retry
                .max_attempts
                .map(|n| n.get()),
            Some(4)
        );
        // Not a number: the error is at the value.
        let bad = |name: &str| (name == "N").then(|| "x".to_owned());
        let text = format!("{GOOD}    max_ack_pending: ${{N}}\n");
        let Err(problems) = parse_str(&text, Path::new("."), &bad) else {
            panic!("accepted");
        };
        assert_eq!(problems[0].0, Pos { line: 8, col: 22 }, "{problems:?}");
    }
}
