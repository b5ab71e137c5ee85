//! The checks of one pipeline file, by concern: the pipeline's name and
//! broker, its topics, each stage and sink (`stage.rs`), each source. A
//! [`Checker`] holds what they share: the file, where problems go, and
//! the maps built as the checks go (topics declared, stage names, state
//! stores). The checks run in the file's order, so problems found at one
//! place keep the order they always had.

use std::collections::{BTreeSet, HashMap};

use crate::config::Pipeline;
use crate::config::broker::NatsOptions;
use crate::config::diagnostic::Diagnostics;
use crate::config::model::default_dlq;
use crate::config::parse::{Document, locate};
use crate::config::tree::Seg;

use super::at;

/// Every check of `doc` alone; its problems go to `diagnostics`.
pub(super) fn check_pipeline(doc: &Document, diagnostics: &mut Diagnostics) {
    let mut checker = Checker::new(doc, diagnostics);
    checker.name_and_broker();
    checker.topics();
    checker.not_empty();
    let p = checker.p;
    crate::config::claim::check_pipeline(p, &mut |path, message| {
        checker.out.push(path, message);
    });
    for (i, stage) in p.stages.iter().enumerate() {
        checker.stage(i, stage);
    }
    for (i, source) in p.sources.iter().enumerate() {
        checker.source(i, source);
    }
}

/// Where a check's problems go: each at its place in the file.
pub(super) struct Report<'a> {
    doc: &'a Document,
    diagnostics: &'a mut Diagnostics,
}

impl Report<'_> {
    /// A problem at the value `path` leads to.
    pub(super) fn push(&mut self, path: &[Seg<'_>], message: String) {
        let pos = locate(&self.doc.tree, path);
        self.diagnostics
            .push(at(&self.doc.pipeline.source, pos, message));
    }
}

/// What the checks of one pipeline share.
pub(super) struct Checker<'a> {
    pub(super) doc: &'a Document,
    pub(super) p: &'a Pipeline,
    pub(super) out: Report<'a>,
    /// Each declared topic, at its first index under `topics:`.
    pub(super) declared: HashMap<&'a str, usize>,
    /// The dead-letter topics that need no declaration.
    pub(super) implicit_dlqs: BTreeSet<String>,
    /// How many of `stages` are plugin stages; the sinks follow them.
    plugin_stages: usize,
    /// Each stage's or sink's name, at its first index in `stages`.
    pub(super) stage_names: HashMap<&'a str, usize>,
    /// Each state store: the first stage naming it, and its `max_bytes`.
    pub(super) stores: HashMap<String, (String, u64)>,
}

impl<'a> Checker<'a> {
    fn new(doc: &'a Document, diagnostics: &'a mut Diagnostics) -> Self {
        let p = &doc.pipeline;
        let implicit_dlqs = p
            .stages
            .iter()
            .map(|s| default_dlq(&p.name, &s.name))
            .chain(p.sources.iter().map(|s| s.dlq_topic(&p.name)))
            .collect();
        Checker {
            doc,
            p,
            out: Report { doc, diagnostics },
            declared: HashMap::new(),
            implicit_dlqs,
            plugin_stages: p.stages.iter().filter(|s| !s.is_sink()).count(),
            stage_names: HashMap::new(),
            stores: HashMap::new(),
        }
    }

    /// The line the value at `path` is on.
    pub(super) fn line(&self, path: &[Seg<'_>]) -> u64 {
        locate(&self.doc.tree, path).line
    }

    /// Where stage `i` is written: sinks were appended to `stages` after
    /// the plugin stages, and their problems are reported where the file
    /// has them, under `sinks:`. Gives the section, the index in it, and
    /// what the entry is.
    pub(super) fn origin(&self, i: usize) -> (&'static str, usize, &'static str) {
        if i < self.plugin_stages {
            ("stages", i, "stage")
        } else {
            ("sinks", i - self.plugin_stages, "sink")
        }
    }

    /// The declared topics, for a message about one that is not.
    pub(super) fn declared_list(&self) -> String {
        let mut names: Vec<&str> = self.p.topics.iter().map(|t| t.name.as_str()).collect();
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
    }

    /// The pipeline's name, and a broker that is `embedded` or a NATS URL.
    fn name_and_broker(&mut self) {
        use Seg::Key as K;
        let p = self.p;
        if !valid_name(&p.name) {
            self.out.push(
                &[K("name")],
                format!(
                    "`{}` is not a valid pipeline name; use lowercase letters, digits, `_`, `-` \
                     and `.` (e.g. `orders`)",
                    p.name
                ),
            );
        }
        if p.broker == "embedded" {
            return;
        }
        if NatsOptions::is_nats_url(&p.broker) {
            if let Err(err) = NatsOptions::parse(&p.broker) {
                self.out.push(&[K("broker")], err.to_string());
            }
        } else {
            self.out.push(
                &[K("broker")],
                format!(
                    "unknown broker `{}`; use `embedded` or a NATS URL such as \
                     `nats://127.0.0.1:4222`",
                    p.broker
                ),
            );
        }
    }

    /// Topic names, each declared once; fills `declared`.
    fn topics(&mut self) {
        use Seg::{Index as I, Key as K};
        for (i, topic) in self.p.topics.iter().enumerate() {
            if !valid_topic(&topic.name) {
                self.out.push(
                    &[K("topics"), I(i)],
                    format!(
                        "`{}` is not a valid topic name; use letters, digits, `_` and `-`, in \
                         parts joined by single dots (e.g. `orders.eu`)",
                        topic.name
                    ),
                );
            }
            if let Some(archive) = topic.retention.as_ref().and_then(|r| r.archive.as_ref()) {
                self.retention_archive(i, archive);
            }
            if let Some(first) = self.declared.insert(&topic.name, i) {
                let line = self.line(&[K("topics"), I(first)]);
                self.out.push(
                    &[K("topics"), I(i)],
                    format!(
                        "topic `{}` is declared twice (first on line {line})",
                        topic.name
                    ),
                );
                self.declared.insert(&topic.name, first);
            }
        }
    }

    /// A topic's `retention.archive`: the block's own problems, and no
    /// archive on NATS, whose server drops by `MaxAge` itself: nothing
    /// could write a message before it goes, so the block would promise
    /// what cannot be kept. Refused rather than warned, since a warning
    /// scrolls past and the messages would go unarchived.
    fn retention_archive(&mut self, i: usize, archive: &crate::config::Archive) {
        use Seg::{Index as I, Key as K};
        let at = [K("topics"), I(i), K("retention"), K("archive")];
        if NatsOptions::is_nats_url(&self.p.broker) {
            self.out.push(
                &at,
                "a retention archive needs the embedded broker: on NATS the server drops \
                 messages by `MaxAge` itself, so nothing can archive them first; use \
                 `retention: <duration>` here, or archive downstream with an `object_store` sink"
                    .into(),
            );
        }
        for problem in archive.check() {
            let mut path = at.to_vec();
            path.extend(problem.path.iter().map(|k| K(k)));
            self.out.push(&path, problem.message);
        }
    }

    /// At least one stage, sink or source. A pipeline of sources alone is
    /// whole: it feeds topics that another pipeline, `sluice tail` or an
    /// outside NATS client consumes.
    fn not_empty(&mut self) {
        if self.p.stages.is_empty() && self.p.sources.is_empty() {
            self.out.push(
                &[Seg::Key("stages")],
                "a pipeline needs at least one stage or sink, or a source".into(),
            );
        }
    }

    /// A source: its name (valid, unique among stages, sinks and sources),
    /// its declared `to:` topic, and its one connector block.
    fn source(&mut self, i: usize, source: &crate::config::SourceDef) {
        use Seg::{Index as I, Key as K};
        let s = |rest: &[Seg<'static>]| -> Vec<Seg<'static>> {
            let mut path = vec![K("sources"), I(i)];
            path.extend_from_slice(rest);
            path
        };
        if !valid_name(&source.name) {
            self.out.push(
                &s(&[K("name")]),
                format!(
                    "`{}` is not a valid source name; use lowercase letters, digits, `_`, `-` \
                     and `.` (e.g. `from-redis`)",
                    source.name
                ),
            );
        }
        if let Some(first) = self.stage_names.get(source.name.as_str()) {
            let (section, index, kind) = self.origin(*first);
            let line = self.line(&[K(section), I(index)]);
            self.out.push(
                &s(&[K("name")]),
                format!(
                    "source `{}` has the name of a {kind} (line {line}); stage, sink and \
                     source names must be unique in a pipeline",
                    source.name
                ),
            );
        }
        if let Some(j) = self.p.sources[..i]
            .iter()
            .position(|o| o.name == source.name)
        {
            let line = self.line(&[K("sources"), I(j)]);
            self.out.push(
                &s(&[K("name")]),
                format!(
                    "source `{}` is defined twice (first on line {line}); stage, sink and \
                     source names must be unique in a pipeline",
                    source.name
                ),
            );
        }
        if !self.declared.contains_key(source.to.as_str()) {
            let declared = self.declared_list();
            self.out.push(
                &s(&[K("to")]),
                format!(
                    "source `{}` publishes to `{}`, which is not declared under `topics:`; {}",
                    source.name, source.to, declared
                ),
            );
        }
        let blocks = source.blocks();
        check_connector_blocks(
            &mut |path, message| self.out.push(path, message),
            &s(&[]),
            "source",
            &source.name,
            crate::config::SourceDef::KINDS,
            blocks.iter().map(|c| (c.kind(), c.check())).collect(),
        );
    }
}

/// Exactly one connector block, and each block's own problems at their
/// keys (`sinks[0].postgres.table`).
pub(super) fn check_connector_blocks(
    report: &mut impl FnMut(&[Seg<'_>], String),
    at: &[Seg<'static>],
    what: &str,
    name: &str,
    kinds: &[&str],
    blocks: Vec<(&'static str, Vec<crate::config::ConfigProblem>)>,
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

/// Pipeline, stage, source and store names: `[a-z0-9_.-]+`.
pub(super) fn valid_name(name: &str) -> bool {
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
