//! Loading a set of pipeline files and checking what they mean: every
//! problem in every file is reported, each at its line and column.
//!
//! Syntax and type errors come from `parse.rs`. This file adds the checks
//! that need more than one value: names, topics that are used but not
//! declared, duplicates (stages, topics, pipelines across files), loops of
//! length one, and ranges serde types cannot express; one file's checks
//! are in `validate/`, one function per concern. A check that needs the
//! runtime (that each plugin file exists and is a Sluice plugin) is a
//! [`PipelineCheck`] its owner implements, handed in by the caller.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::diagnostic::{Diagnostic, Diagnostics};
use super::model::Pipeline;
use super::parse::{Document, Problem, locate, read_file};
use super::tree::{Pos, Seg};

mod grants;
mod pipeline;
mod stage;

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
        pipeline::check_pipeline(doc, &mut diagnostics);
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
    let deliveries = pipeline.stages.iter_mut().map(|s| &mut s.delivery);
    for delivery in deliveries.chain(pipeline.sinks.iter_mut().map(|s| &mut s.delivery)) {
        if let Some(archive) = delivery.dlq.as_mut().and_then(|d| d.archive.as_mut()) {
            archive.resolve_paths(dir);
        }
    }
    for topic in &mut pipeline.topics {
        if let Some(archive) = topic.retention.as_mut().and_then(|r| r.archive.as_mut()) {
            archive.resolve_paths(dir);
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
