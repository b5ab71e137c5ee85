//! Loading a set of pipeline files and checking what they mean: every
//! problem in every file is reported, each at its line and column.
//!
//! Syntax and type errors come from `parse.rs`. This file adds the checks
//! that need more than one value: names, topics that are used but not
//! declared, duplicates (stages, topics, pipelines across files), loops of
//! length one, and ranges serde types cannot express. A check that needs
//! the runtime (that each plugin file exists and is a Sluice plugin) is a
//! [`PipelineCheck`] its owner implements, handed in by the caller.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::broker::NatsOptions;
use super::diagnostic::{Diagnostic, Diagnostics};
use super::model::{Pipeline, Priority, default_dlq};
use super::parse::{Document, Problem, locate, read_file};
use super::tree::{Pos, Seg};

/// A check of a loaded pipeline that config cannot make itself, because
/// it needs a part of the runtime (a stage's plugin file needs the plugin
/// host: `crate::plugin::PluginCheck`). The part that owns the concept
/// implements it; whoever orchestrates validation (`sluice validate`, the
/// daemon) hands it to [`load_checked`], and each problem it finds is
/// reported at its place in the file, among the loader's own.
pub trait PipelineCheck {
    /// The problems of `pipeline` (already checked by the loader, maybe
    /// with problems of its own), each at the path of keys and indices to
    /// the value it is about (`stages`, `2`, `plugin`).
    fn check(&mut self, pipeline: &Pipeline) -> Vec<(Vec<Seg<'static>>, String)>;
}

/// Loads the pipeline files and directories in `paths` (a directory
/// contributes its `*.yaml` and `*.yml` files, sorted by name), expanding
/// `${VAR}` from the process environment, and checks them. Plugin files are
/// not opened; see [`load_checked`].
///
/// # Errors
///
/// Every problem found, in every file.
pub fn load(paths: &[PathBuf]) -> Result<Vec<Pipeline>, Diagnostics> {
    load_with(paths, &|name| std::env::var(name).ok(), None)
}

/// Like [`load`], and also runs `check` over every pipeline (with
/// `crate::plugin::PluginCheck`, loads every stage's plugin: a missing
/// file, a file that is not a component, and a component that is not a
/// Sluice plugin, or of another contract version, are reported at the
/// stage's `plugin:` line).
///
/// # Errors
///
/// Every problem found, in every file.
pub fn load_checked(
    paths: &[PathBuf],
    check: &mut dyn PipelineCheck,
) -> Result<Vec<Pipeline>, Diagnostics> {
    load_with(paths, &|name| std::env::var(name).ok(), Some(check))
}

/// [`load`] with an explicit variable lookup and an optional
/// [`PipelineCheck`].
///
/// # Errors
///
/// Every problem found, in every file.
pub fn load_with(
    paths: &[PathBuf],
    env: &dyn Fn(&str) -> Option<String>,
    check: Option<&mut dyn PipelineCheck>,
) -> Result<Vec<Pipeline>, Diagnostics> {
    let mut diagnostics = Diagnostics::default();
    let files = expand(paths, &mut diagnostics);
    let parsed = files
        .into_iter()
        .map(|file| {
            let doc = read_file(&file, env);
            (file, doc)
        })
        .collect();
    check_documents(parsed, diagnostics, check)
}

/// The pipeline file `path` from its bytes, checked as [`load`] checks it:
/// the loader without the file system, for the fuzz targets.
#[cfg(feature = "fuzz")]
pub(crate) fn load_bytes(path: &Path, bytes: &[u8]) -> Result<Vec<Pipeline>, Diagnostics> {
    let env = |name: &str| (name == "SET").then(|| "value".to_owned());
    let doc = super::parse::parse_bytes(
        bytes.to_vec(),
        path.parent().unwrap_or(Path::new(".")),
        &env,
    );
    check_documents(vec![(path.to_owned(), doc)], Diagnostics::default(), None)
}

/// Checks parsed files alone and together; `diagnostics` holds what was
/// found before (files that could not be listed).
fn check_documents(
    parsed: Vec<(PathBuf, Result<Document, Vec<Problem>>)>,
    mut diagnostics: Diagnostics,
    check: Option<&mut dyn PipelineCheck>,
) -> Result<Vec<Pipeline>, Diagnostics> {
    let mut docs: Vec<Document> = Vec::new();
    for (file, doc) in parsed {
        let file = &file;
        match doc {
            Ok(mut doc) => {
                doc.pipeline.source = file.clone();
                resolve_plugins(&mut doc.pipeline, file);
                // Each sink runs as a stage with a built-in handler, after
                // the plugin stages: every stage check below covers it.
                let sinks: Vec<_> = doc.pipeline.sinks.iter().map(|s| s.to_stage()).collect();
                doc.pipeline.stages.extend(sinks);
                super::claim::resolve_paths(&mut doc.pipeline, file);
                docs.push(doc);
            }
            Err(problems) => {
                for (pos, message) in problems {
                    diagnostics.push(at(file, pos, message));
                }
            }
        }
    }
    for doc in &docs {
        check_pipeline(doc, &mut diagnostics);
    }
    check_unique_pipelines(&docs, &mut diagnostics);
    super::claim::check_shared_topics(&docs, &mut diagnostics);
    if let Some(check) = check {
        for doc in &docs {
            for (path, message) in check.check(&doc.pipeline) {
                let pos = locate(&doc.tree, &path);
                diagnostics.push(at(&doc.pipeline.source, pos, message));
            }
        }
    }
    if diagnostics.is_empty() {
        Ok(docs.into_iter().map(|d| d.pipeline).collect())
    } else {
        diagnostics.sort();
        Err(diagnostics)
    }
}

fn at(file: &Path, pos: Pos, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        file: file.to_owned(),
        line: pos.line,
        col: pos.col,
        message: message.into(),
    }
}

/// Files named directly, and the `*.yaml`/`*.yml` files of directories.
fn expand(paths: &[PathBuf], diagnostics: &mut Diagnostics) -> Vec<PathBuf> {
    let start = Pos { line: 1, col: 1 };
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => {
                diagnostics.push(at(path, start, format!("cannot read the directory: {e}")));
                continue;
            }
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
            })
            .collect();
        found.sort();
        if found.is_empty() {
            diagnostics.push(at(
                path,
                start,
                "the directory has no pipeline files (*.yaml or *.yml)",
            ));
        }
        files.extend(found);
    }
    // The same file named twice (`sluice validate p.yaml pipelines/`) is one pipeline.
    let mut seen = BTreeSet::new();
    files.retain(|f| seen.insert(f.canonicalize().unwrap_or_else(|_| f.clone())));
    files
}

/// Makes each stage's plugin path (and each connector's `tls_ca`)
/// absolute against the file's directory.
fn resolve_plugins(pipeline: &mut Pipeline, file: &Path) {
    let dir = file.parent().unwrap_or(Path::new("."));
    for stage in &mut pipeline.stages {
        if stage.plugin.is_relative() && !stage.is_sink() {
            stage.plugin = dir.join(&stage.plugin);
        }
    }
    for source in &mut pipeline.sources {
        source.resolve_paths(dir);
    }
    for sink in &mut pipeline.sinks {
        sink.resolve_paths(dir);
    }
}

/// Pipeline and stage names: `[a-z0-9_.-]+`.
/// A stage's `state:`: a valid store name, a size, one world that can
/// commit state, and one size per shared store.
fn check_state(
    report: &mut impl FnMut(&[Seg<'_>], String),
    at: &impl Fn(&[Seg<'static>]) -> Vec<Seg<'static>>,
    stage: &super::Stage,
    grant: &super::StateGrant,
    stores: &mut HashMap<String, (String, u64)>,
) {
    use Seg::Key as K;
    let store = grant.store_or(&stage.name);
    if grant.store.is_some() && !valid_name(store) {
        report(
            &at(&[K("state"), K("store")]),
            format!(
                "`{store}` is not a valid store name; use lowercase letters, digits, `_`, `-` \
                 and `.` (e.g. `charges`)"
            ),
        );
    }
    if grant.max_bytes.bytes() == 0 {
        report(
            &at(&[K("state"), K("max_bytes")]),
            "`max_bytes` must be more than 0 (e.g. `64MiB`)".into(),
        );
    }
    if stage.batch.is_some() {
        report(
            &at(&[K("state")]),
            format!(
                "stage `{}` has both `state:` and `batch:`; state commits with one message's \
                 outcome, and a batch's items settle one by one, so use one or the other",
                stage.name
            ),
        );
    }
    match stores.get(store) {
        Some((first, max)) if *max != grant.max_bytes.bytes() => report(
            &at(&[K("state"), K("max_bytes")]),
            format!(
                "stage `{}` shares the state store `{store}` with stage `{first}` but gives it \
                 another `max_bytes`; a shared store has one limit, so give both the same",
                stage.name
            ),
        ),
        Some(_) => {}
        None => {
            stores.insert(
                store.to_owned(),
                (stage.name.clone(), grant.max_bytes.bytes()),
            );
        }
    }
}

/// A stage's `http:` grant: hosts that parse, headers only for listed
/// hosts, header names and values HTTP can carry.
fn check_http(
    report: &mut impl FnMut(&[Seg<'_>], String),
    at: &impl Fn(&[Seg<'static>]) -> Vec<Seg<'static>>,
    grant: &super::HttpGrant,
) {
    use Seg::{Index as I, Key as K};
    if grant.allow.is_empty() {
        report(
            &at(&[K("http"), K("allow")]),
            "`allow` lists no host, so no request could be made; list the hosts the handler \
             calls (e.g. `allow: [api.example.com]`)"
                .into(),
        );
    }
    let mut allowed = Vec::new();
    for (i, entry) in grant.allow.iter().enumerate() {
        match super::AllowedHost::parse(entry) {
            Ok(host) => allowed.push(host),
            Err(why) => report(&at(&[K("http"), K("allow"), I(i)]), why),
        }
    }
    if grant.timeout.is_some_and(|t| t.get().is_zero()) {
        report(
            &at(&[K("http"), K("timeout")]),
            "`timeout` must be more than 0 (e.g. `5s`)".into(),
        );
    }
    let headers_at = at(&[K("http"), K("headers")]);
    fn under<'a>(base: &[Seg<'static>], host: &'a str, name: Option<&'a str>) -> Vec<Seg<'a>> {
        let mut path: Vec<Seg<'a>> = base.to_vec();
        path.push(Seg::Key(host));
        path.extend(name.map(Seg::Key));
        path
    }
    for (host, headers) in &grant.headers {
        let listed = super::AllowedHost::parse(host)
            .is_ok_and(|h| allowed.iter().any(|a| a.host == h.host && a.port == h.port));
        if !listed {
            report(
                &under(&headers_at, host, None),
                format!(
                    "`headers` for `{host}`, which is not in `allow`; headers go only to a \
                     listed host (as written there, port included)"
                ),
            );
        }
        for (name, value) in headers {
            let path = under(&headers_at, host, Some(name));
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                report(&path, format!("`{name}` is not an HTTP header name"));
            } else if super::is_reserved_header(name) {
                report(
                    &path,
                    format!("`{name}` belongs to the connection; the sender writes it"),
                );
            }
            if http::HeaderValue::from_str(value.expose()).is_err() {
                report(
                    &path,
                    format!(
                        "header `{name}`: its value (`{}`) cannot be sent in a header (line \
                         breaks or control characters, here or in a secret it uses)",
                        value.written()
                    ),
                );
            }
        }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

/// Topic names: `[A-Za-z0-9_-]+` tokens joined by single dots, so each is
/// also a NATS subject as it is.
fn valid_topic(name: &str) -> bool {
    name.split('.').all(|token| {
        !token.is_empty()
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
    })
}

fn check_pipeline(doc: &Document, diagnostics: &mut Diagnostics) {
    let p = &doc.pipeline;
    let file = &p.source;
    let mut report = |path: &[Seg<'_>], message: String| {
        diagnostics.push(at(file, locate(&doc.tree, path), message));
    };
    use Seg::{Index as I, Key as K};

    if !valid_name(&p.name) {
        report(
            &[K("name")],
            format!(
                "`{}` is not a valid pipeline name; use lowercase letters, digits, `_`, `-` \
                 and `.` (e.g. `orders`)",
                p.name
            ),
        );
    }

    if p.broker != "embedded" {
        if NatsOptions::is_nats_url(&p.broker) {
            if let Err(err) = NatsOptions::parse(&p.broker) {
                report(&[K("broker")], err.to_string());
            }
        } else {
            report(
                &[K("broker")],
                format!(
                    "unknown broker `{}`; use `embedded` or a NATS URL such as \
                     `nats://127.0.0.1:4222`",
                    p.broker
                ),
            );
        }
    }

    let mut declared: HashMap<&str, usize> = HashMap::new();
    for (i, topic) in p.topics.iter().enumerate() {
        if !valid_topic(&topic.name) {
            report(
                &[K("topics"), I(i)],
                format!(
                    "`{}` is not a valid topic name; use letters, digits, `_` and `-`, in \
                     parts joined by single dots (e.g. `orders.eu`)",
                    topic.name
                ),
            );
        }
        if let Some(first) = declared.insert(&topic.name, i) {
            let line = locate(&doc.tree, &[K("topics"), I(first)]).line;
            report(
                &[K("topics"), I(i)],
                format!(
                    "topic `{}` is declared twice (first on line {line})",
                    topic.name
                ),
            );
            declared.insert(&topic.name, first);
        }
    }
    let implicit_dlqs: BTreeSet<String> = p
        .stages
        .iter()
        .map(|s| default_dlq(&p.name, &s.name))
        .chain(p.sources.iter().map(|s| s.dlq_topic(&p.name)))
        .collect();
    let declared_list = || {
        let mut names: Vec<&str> = p.topics.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            "none are declared".to_owned()
        } else {
            format!(
                "declared topics are {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };

    // A pipeline of sources alone is whole: it feeds topics that another
    // pipeline, `sluice tail` or an outside NATS client consumes.
    if p.stages.is_empty() && p.sources.is_empty() {
        report(
            &[K("stages")],
            "a pipeline needs at least one stage or sink, or a source".into(),
        );
    }

    super::claim::check_pipeline(p, &mut report);

    // Sinks were appended to `stages` after the plugin stages; their
    // problems are reported where the file has them, under `sinks:`.
    let plugin_stages = p.stages.iter().filter(|s| !s.is_sink()).count();
    let origin = |i: usize| {
        if i < plugin_stages {
            ("stages", i, "stage")
        } else {
            ("sinks", i - plugin_stages, "sink")
        }
    };
    let mut stage_names: HashMap<&str, usize> = HashMap::new();
    let mut stores: HashMap<String, (String, u64)> = HashMap::new();
    for (i, stage) in p.stages.iter().enumerate() {
        let (section, index, what) = origin(i);
        let s = |rest: &[Seg<'static>]| -> Vec<Seg<'static>> {
            let mut path = vec![K(section), I(index)];
            path.extend_from_slice(rest);
            path
        };
        for (key, value) in &stage.config {
            if value.value.contains(super::secrets::OPEN) {
                report(
                    &[K(section), I(index), K("config"), K(key.as_str())],
                    format!(
                        "`config.{key}` holds a `{{secret:...}}` reference, which is not \
                         resolved in `config:` (its values are shown to operators); list the \
                         secret under the stage's `secrets:` and read it from the handler \
                         (contract 0.2.0), and a connector's password and token fields take \
                         `{{secret:name}}`"
                    ),
                );
            }
        }
        let mut listed = HashSet::new();
        for (j, name) in stage.secrets.iter().enumerate() {
            if !p.secrets.contains_key(name) {
                let defined: Vec<&str> = p.secrets.keys().map(String::as_str).collect();
                report(
                    &s(&[K("secrets"), I(j)]),
                    format!(
                        "stage `{}` lists the secret `{name}`, which the pipeline's `secrets:` \
                         block does not define ({}); add `{name}: {{env: VAR}}` or \
                         `{name}: {{file: PATH}}` there",
                        stage.name,
                        if defined.is_empty() {
                            "it defines none".to_owned()
                        } else {
                            format!("it defines: {}", defined.join(", "))
                        }
                    ),
                );
            } else if !listed.insert(name.as_str()) {
                report(
                    &s(&[K("secrets"), I(j)]),
                    format!("stage `{}` lists the secret `{name}` twice", stage.name),
                );
            }
        }

        if !valid_name(&stage.name) {
            report(
                &s(&[K("name")]),
                format!(
                    "`{}` is not a valid stage name; use lowercase letters, digits, `_`, `-` \
                     and `.` (e.g. `route`)",
                    stage.name
                ),
            );
        }
        if let Some(first) = stage_names.insert(&stage.name, i) {
            let (section, index, _) = origin(first);
            let (_, _, kind) = origin(i);
            let line = locate(&doc.tree, &[K(section), I(index)]).line;
            report(
                &s(&[K("name")]),
                format!(
                    "{kind} `{}` is defined twice (first on line {line}); stage, sink and \
                     source names must be unique in a pipeline",
                    stage.name
                ),
            );
            stage_names.insert(&stage.name, first);
        }

        let lanes = stage.subscribe.has_lanes() || stage.subscribe.priority.is_some();
        let mut subscribed = BTreeSet::new();
        for (j, input) in stage.subscribe.topics.iter().enumerate() {
            let path = if lanes {
                s(&[K("subscribe"), K("topics"), I(j)])
            } else {
                s(&[K("subscribe"), K("topic")])
            };
            if !subscribed.insert(input.as_str()) {
                report(
                    &path,
                    format!("`{input}` is listed twice under `topics`; list each topic once"),
                );
            }
            if !declared.contains_key(input.as_str()) && !implicit_dlqs.contains(input) {
                report(
                    &path,
                    format!(
                        "{what} `{}` subscribes to `{input}`, which is not declared under `topics:`; {}",
                        stage.name,
                        declared_list()
                    ),
                );
            }
        }
        if let Some(Priority::Weighted(weights)) = &stage.subscribe.priority {
            let path = s(&[K("subscribe"), K("priority"), K("weighted")]);
            for topic in weights.keys() {
                if !subscribed.contains(topic.as_str()) {
                    report(
                        &path,
                        format!(
                            "`{topic}` has a weight but is not among `topics`; weigh only the \
                             topics the stage subscribes to"
                        ),
                    );
                }
            }
            let missing: Vec<&str> = subscribed
                .iter()
                .copied()
                .filter(|topic| !weights.contains_key(*topic))
                .collect();
            if !missing.is_empty() {
                report(
                    &path,
                    format!(
                        "give every subscribed topic a weight (at least 1); missing: {}",
                        missing.join(", ")
                    ),
                );
            }
        }
        for header in stage.subscribe.filter.keys() {
            if header.trim().is_empty() {
                report(
                    &s(&[K("subscribe"), K("filter")]),
                    "a filter header name cannot be empty".into(),
                );
            }
        }

        let mut seen = BTreeSet::new();
        for (j, topic) in stage.publish.iter().enumerate() {
            let path = s(&[K("publish"), I(j)]);
            if !declared.contains_key(topic.as_str()) {
                report(
                    &path,
                    format!(
                        "{what} `{}` publishes to `{topic}`, which is not declared under \
                         `topics:`; {}",
                        stage.name,
                        declared_list()
                    ),
                );
            }
            if subscribed.contains(topic.as_str()) && !stage.timers {
                report(
                    &path,
                    format!(
                        "{what} `{}` publishes to `{topic}`, its own input: every output would \
                         come back to it (a handler that schedules work for itself with \
                         delayed emits sets `timers: true`)",
                        stage.name
                    ),
                );
            }
            if !seen.insert(topic) {
                report(&path, format!("`{topic}` is listed twice under `publish:`"));
            }
        }

        if let Some(dlq) = &stage.dlq {
            let path = s(&[K("dlq")]);
            if !declared.contains_key(dlq.as_str()) && !implicit_dlqs.contains(dlq) {
                report(
                    &path,
                    format!(
                        "{what} `{}` dead-letters to `{dlq}`, which is not declared under \
                         `topics:` (only the default `{}` needs no declaration); {}",
                        stage.name,
                        default_dlq(&p.name, &stage.name),
                        declared_list()
                    ),
                );
            }
            if subscribed.contains(dlq.as_str()) {
                report(
                    &path,
                    format!(
                        "{what} `{}` dead-letters to `{dlq}`, its own input: failed messages \
                         would be retried forever",
                        stage.name
                    ),
                );
            }
        }

        let backoff = &stage.retry.backoff;
        if !(backoff.multiplier.is_finite() && backoff.multiplier >= 1.0) {
            report(
                &s(&[K("retry"), K("backoff"), K("multiplier")]),
                format!(
                    "`multiplier` is {}; it must be at least 1 (1 = a constant delay)",
                    backoff.multiplier
                ),
            );
        }
        if !(0.0..=1.0).contains(&backoff.jitter) {
            report(
                &s(&[K("retry"), K("backoff"), K("jitter")]),
                format!(
                    "`jitter` is {}; it must be between 0 (no jitter) and 1",
                    backoff.jitter
                ),
            );
        }
        if backoff.initial > backoff.max {
            report(
                &s(&[K("retry"), K("backoff"), K("initial")]),
                format!(
                    "the first backoff delay ({}) is longer than the longest ({})",
                    backoff.initial, backoff.max
                ),
            );
        }
        if backoff.max.get() > crate::timestamp::MAX_DELAY {
            report(
                &s(&[K("retry"), K("backoff"), K("max")]),
                format!(
                    "the longest backoff delay ({}) is over the limit of 365 days",
                    backoff.max
                ),
            );
        }
        if let Some(waits) = &stage.retry.schedule {
            if waits.is_empty() {
                report(
                    &s(&[K("retry"), K("schedule")]),
                    "`schedule` is empty: list the waits before each retry, like [1m, 5m, 30m], or remove it to use `backoff`".to_owned(),
                );
            }
            if let Some(long) = waits.iter().find(|w| w.get() > crate::timestamp::MAX_DELAY) {
                report(
                    &s(&[K("retry"), K("schedule")]),
                    format!("a wait of {long} is over the limit of 365 days"),
                );
            }
        }
        for (key, value) in [("ack_wait", stage.ack_wait), ("timeout", stage.timeout)] {
            if value.get().is_zero() {
                report(&s(&[K(key)]), format!("`{key}` must be longer than 0s"));
            }
        }
        let memory = stage.memory.bytes();
        if !(1 << 20..=4 << 30).contains(&memory) {
            report(
                &s(&[K("memory")]),
                format!(
                    "`memory` is {}; it must be between 1MiB and 4GiB (a 32-bit memory)",
                    stage.memory
                ),
            );
        }
        if stage.max_ack_pending == Some(0) {
            report(
                &s(&[K("max_ack_pending")]),
                "`max_ack_pending` must be at least 1 (leave it out for no limit)".into(),
            );
        }
        if let Some(dedup) = &stage.dedup {
            let lease = stage.timeout.get() + super::LEASE_MARGIN;
            if dedup.ttl.get().is_zero() {
                report(
                    &s(&[K("dedup"), K("ttl")]),
                    "`ttl` must be longer than 0s (leave `dedup:` out for no dedup)".into(),
                );
            } else if dedup.ttl.get() < lease {
                report(
                    &s(&[K("dedup"), K("ttl")]),
                    format!(
                        "`ttl` ({}) must be at least the stage's `timeout` plus 5s ({}): a key \
                         would expire while its handler still runs, and a copy of the message \
                         could run too",
                        humantime::format_duration(dedup.ttl.get()),
                        humantime::format_duration(lease)
                    ),
                );
            }
            if stage.batch.is_some() {
                report(
                    &s(&[K("dedup")]),
                    format!(
                        "{what} `{}` has both `dedup:` and `batch:`; dedup works per message, \
                         so use one or the other",
                        stage.name
                    ),
                );
            }
        }
        if let Some(grant) = &stage.state {
            check_state(&mut report, &s, stage, grant, &mut stores);
        }
        if let Some(grant) = &stage.http {
            check_http(&mut report, &s, grant);
        }
        if let Some(sink) = &stage.sink {
            let blocks = sink.blocks();
            check_connector_blocks(
                &mut report,
                &s(&[]),
                "sink",
                &sink.name,
                super::SinkDef::KINDS,
                blocks.iter().map(|c| (c.kind(), c.check())).collect(),
            );
        }
    }

    for (i, source) in p.sources.iter().enumerate() {
        let s = |rest: &[Seg<'static>]| -> Vec<Seg<'static>> {
            let mut path = vec![K("sources"), I(i)];
            path.extend_from_slice(rest);
            path
        };
        if !valid_name(&source.name) {
            report(
                &s(&[K("name")]),
                format!(
                    "`{}` is not a valid source name; use lowercase letters, digits, `_`, `-` \
                     and `.` (e.g. `from-redis`)",
                    source.name
                ),
            );
        }
        if let Some(first) = stage_names.get(source.name.as_str()) {
            let (section, index, kind) = origin(*first);
            let line = locate(&doc.tree, &[K(section), I(index)]).line;
            report(
                &s(&[K("name")]),
                format!(
                    "source `{}` has the name of a {kind} (line {line}); stage, sink and \
                     source names must be unique in a pipeline",
                    source.name
                ),
            );
        }
        if let Some(j) = p.sources[..i].iter().position(|o| o.name == source.name) {
            let line = locate(&doc.tree, &[K("sources"), I(j)]).line;
            report(
                &s(&[K("name")]),
                format!(
                    "source `{}` is defined twice (first on line {line}); stage, sink and \
                     source names must be unique in a pipeline",
                    source.name
                ),
            );
        }
        if !declared.contains_key(source.to.as_str()) {
            report(
                &s(&[K("to")]),
                format!(
                    "source `{}` publishes to `{}`, which is not declared under `topics:`; {}",
                    source.name,
                    source.to,
                    declared_list()
                ),
            );
        }
        let blocks = source.blocks();
        check_connector_blocks(
            &mut report,
            &s(&[]),
            "source",
            &source.name,
            super::SourceDef::KINDS,
            blocks.iter().map(|c| (c.kind(), c.check())).collect(),
        );
    }
}

/// Exactly one connector block, and each block's own problems at their
/// keys (`sinks[0].postgres.table`).
fn check_connector_blocks(
    report: &mut impl FnMut(&[Seg<'_>], String),
    at: &[Seg<'static>],
    what: &str,
    name: &str,
    kinds: &[&str],
    blocks: Vec<(&'static str, Vec<super::ConfigProblem>)>,
) {
    let listed = kinds
        .iter()
        .map(|k| format!("`{k}:`"))
        .collect::<Vec<_>>()
        .join(", ");
    match blocks.as_slice() {
        [] => report(
            at,
            format!("{what} `{name}` needs one connector block: one of {listed}"),
        ),
        [_] => {}
        [_, second, ..] => {
            let mut path = at.to_vec();
            path.push(Seg::Key(second.0));
            report(
                &path,
                format!(
                    "{what} `{name}` has more than one connector block; give exactly one of {listed}"
                ),
            );
        }
    }
    for (kind, problems) in blocks {
        for problem in problems {
            let mut path = at.to_vec();
            path.push(Seg::Key(kind));
            path.extend(problem.path.iter().map(|k| Seg::Key(k)));
            report(&path, problem.message);
        }
    }
}

fn check_unique_pipelines(docs: &[Document], diagnostics: &mut Diagnostics) {
    let mut seen: HashMap<&str, &Document> = HashMap::new();
    for doc in docs {
        if let Some(first) = seen.get(doc.pipeline.name.as_str()) {
            let pos = locate(&first.tree, &[Seg::Key("name")]);
            diagnostics.push(at(
                &doc.pipeline.source,
                locate(&doc.tree, &[Seg::Key("name")]),
                format!(
                    "pipeline `{}` is already defined in {}:{}:{}; pipeline names must be unique",
                    doc.pipeline.name,
                    first.pipeline.source.display(),
                    pos.line,
                    pos.col
                ),
            ));
        } else {
            seen.insert(&doc.pipeline.name, doc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{e}"));
        match load_with(&[file], &|_| None, None) {
            Ok(_) => Vec::new(),
            Err(d) => d
                .iter()
                .map(|d| format!("{}:{}: {}", d.line, d.col, d.message))
                .collect(),
        }
    }

    #[test]
    fn reports_every_semantic_error_with_its_position() {
        let errs = check(
            "name: shop\n\
             topics: [in, out, in]\n\
             stages:\n\
             \x20 - name: a\n\
             \x20   subscribe: nowhere\n\
             \x20   plugin: x.wasm\n\
             \x20   publish: [out, ghost]\n\
             \x20 - name: a\n\
             \x20   subscribe: {topic: in}\n\
             \x20   plugin: x.wasm\n\
             \x20   publish: [in]\n\
             \x20   dlq: elsewhere\n\
             \x20   retry: {backoff: {multiplier: 0.5, jitter: 2}}\n",
        );
        let expect = [
            "2:19: topic `in` is declared twice",
            "5:16: stage `a` subscribes to `nowhere`",
            "7:20: stage `a` publishes to `ghost`",
            "8:11: stage `a` is defined twice",
            "11:15: stage `a` publishes to `in`, its own input",
            "12:10: stage `a` dead-letters to `elsewhere`",
            "13:35: `multiplier` is 0.5",
            "13:48: `jitter` is 2",
        ];
        for e in expect {
            assert!(
                errs.iter().any(|got| got.starts_with(e)),
                "missing {e:?} in {errs:#?}"
            );
        }
        assert_eq!(errs.len(), expect.len(), "{errs:#?}");
    }

    #[test]
    fn retry_waits_may_be_days_but_not_over_a_year_and_a_schedule_is_not_empty() {
        let stage = |retry: &str| {
            check(&format!(
                "name: shop\ntopics: [in]\nstages:\n\
                 \x20 - {{name: a, subscribe: in, plugin: x.wasm, retry: {retry}}}\n"
            ))
        };
        assert!(stage("{backoff: {max: 3d}, schedule: [1m, 5m, 30m, 2h, 8h, 3d]}").is_empty());
        let errs = stage("{backoff: {max: 400d}}");
        assert!(
            errs.iter()
                .any(|e| e.contains("over the limit of 365 days")),
            "{errs:?}"
        );
        let errs = stage("{schedule: []}");
        assert!(
            errs.iter().any(|e| e.contains("`schedule` is empty")),
            "{errs:?}"
        );
        let errs = stage("{schedule: [1m, 500d]}");
        assert!(
            errs.iter()
                .any(|e| e.starts_with("4:") && e.contains("a wait of 1year")),
            "{errs:?}"
        );
    }

    #[test]
    fn implicit_dlqs_need_no_declaration() {
        let errs = check(
            "name: shop\ntopics: [in]\nstages:\n\
             \x20 - {name: a, subscribe: in, plugin: x.wasm, dlq: shop.a.dlq}\n\
             \x20 - {name: redo, subscribe: shop.a.dlq, plugin: x.wasm}\n",
        );
        assert_eq!(errs, Vec::<String>::new());
    }

    #[test]
    fn priority_lanes_name_declared_topics_once_and_weigh_each() {
        let pipeline = |subscribe: &str| {
            check(&format!(
                "name: shop\ntopics: [a, b, out]\nstages:\n\
                 \x20 - name: s\n\
                 \x20   plugin: x.wasm\n\
                 \x20   publish: [out]\n\
                 \x20   subscribe: {subscribe}\n"
            ))
        };
        assert_eq!(
            pipeline("{topics: [a, b], priority: strict}"),
            Vec::<String>::new()
        );
        assert_eq!(
            pipeline("{topics: [a, b], priority: {weighted: {a: 8, b: 1}}}"),
            Vec::<String>::new()
        );
        let errs = pipeline("{topics: [a, nowhere]}");
        assert!(
            errs.iter().any(|e| e.contains("subscribes to `nowhere`")),
            "{errs:?}"
        );
        let errs = pipeline("{topics: [a, a]}");
        assert!(errs.iter().any(|e| e.contains("listed twice")), "{errs:?}");
        let errs = pipeline("{topics: [a, out]}");
        assert!(errs.iter().any(|e| e.contains("its own input")), "{errs:?}");
        let errs = pipeline("{topics: [a, b], priority: {weighted: {a: 8, c: 1}}}");
        assert!(
            errs.iter().any(|e| e.contains("`c` has a weight")),
            "{errs:?}"
        );
        assert!(errs.iter().any(|e| e.contains("missing: b")), "{errs:?}");
        let errs = pipeline("{topics: [a, b], priority: {weighted: {a: 0, b: 1}}}");
        assert!(!errs.is_empty(), "a zero weight is refused");
    }

    #[test]
    fn rates_read_short_and_full_and_refuse_nonsense() {
        let pipeline = |rate: &str| {
            check(&format!(
                "name: shop\ntopics: [a]\nstages:\n\
                 \x20 - {{name: s, subscribe: a, plugin: x.wasm, rate: {rate}}}\n"
            ))
        };
        assert_eq!(pipeline("50/s"), Vec::<String>::new());
        assert_eq!(
            pipeline("{limit: 3000/min, burst: 10}"),
            Vec::<String>::new()
        );
        assert_eq!(
            pipeline("{limit: 5/s, per: key, max_keys: 100}"),
            Vec::<String>::new()
        );
        assert_eq!(
            pipeline("{limit: 5/s, per: \"header:tenant\"}"),
            Vec::<String>::new()
        );
        for (bad, says) in [
            ("50", "a rate such as `50/s`"),
            ("50/fortnight", "not a rate"),
            ("{limit: 0/s}", "more than zero"),
            ("{limit: 5/s, burst: 0}", ""),
            ("{limit: 5/s, per: value}", "not an ordering key"),
            ("{limit: 5/s, speed: 3}", "speed"),
        ] {
            let errs = pipeline(bad);
            assert!(errs.iter().any(|e| e.contains(says)), "{bad}: {errs:?}");
        }
    }
}
