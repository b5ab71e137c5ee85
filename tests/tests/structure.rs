//! The runtime's structure, read from its source: no file-level import
//! circle, and no folder-level cycle (issue 44): the top-level modules of
//! `runtime/src` form the order ARCHITECTURE.md writes down.
//!
//! Every `crate::...` and `super::...` path counts, in `use` lines and
//! inline in code (`crate::connect::SourceDef` in a type is an edge as
//! much as an import), outside comments and `#[cfg(test)]` modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file: its module path (`broker/embedded/commit/group.rs` is
/// `broker::embedded::commit::group`) and its code without comments and
/// test modules.
struct Source {
    module: Vec<String>,
    code: String,
}

fn runtime_src() -> PathBuf {
    sluice_harness::repo_root().join("runtime/src")
}

fn sources() -> Vec<Source> {
    let root = runtime_src();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read runtime/src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.push(Source {
                    module: module_of(&root, &path),
                    code: code_only(&text),
                });
            }
        }
    }
    out.sort_by(|a, b| a.module.cmp(&b.module));
    out
}

/// `a/b.rs` -> [a, b]; `a/mod.rs` -> [a]; `lib.rs`/`main.rs` -> [].
fn module_of(root: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(root).expect("under runtime/src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

/// The code of a file: line comments dropped, and from a `#[cfg(test)]`
/// module on, nothing (test modules sit at the end of a file; a
/// test-only item elsewhere is read as code).
fn code_only(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path the code names from `crate::` or `super::`, resolved to the
/// module path it starts with, `use` groups (`a::{b, c::d}`) expanded.
fn paths_named(source: &Source) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let code = &source.code;
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        let at = &bytes[i..];
        if boundary && (at.starts_with(b"crate::") || at.starts_with(b"super::")) {
            // An ASCII byte: a char boundary.
            let (path, used) = read_path(&code[i..]);
            let base: Vec<String> = if path[0] == "crate" {
                Vec::new()
            } else {
                source.module.clone()
            };
            for expanded in expand(&path) {
                out.push(resolve_relative(&base, &expanded));
            }
            i += used.max(1);
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A path's text from its start: segments and `{...}` groups, up to the
/// first byte that cannot continue it. Returns the text split at the top
/// level, and how many bytes it took.
fn read_path(text: &str) -> (Vec<String>, usize) {
    let bytes = text.as_bytes();
    let mut depth = 0;
    let mut end = 0;
    while end < bytes.len() {
        let b = bytes[end];
        match b {
            b'{' => depth += 1,
            b'}' if depth > 0 => depth -= 1,
            b'}' => break,
            _ if depth > 0 => {}
            _ if is_ident(b) || b == b':' => {}
            _ => break,
        }
        end += 1;
    }
    let whole = &text[..end];
    let mut segments = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let wb = whole.as_bytes();
    let mut k = 0;
    while k < wb.len() {
        match wb[k] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b':' if depth == 0 && wb.get(k + 1) == Some(&b':') => {
                segments.push(whole[start..k].to_owned());
                start = k + 2;
                k += 1;
            }
            _ => {}
        }
        k += 1;
    }
    segments.push(whole[start..].to_owned());
    segments.retain(|s| !s.is_empty());
    (segments, end)
}

/// `[crate, a, {b, c::d}]` -> `[crate, a, b]`, `[crate, a, c, d]`.
fn expand(path: &[String]) -> Vec<Vec<String>> {
    let Some(last) = path.last() else {
        return Vec::new();
    };
    let head = &path[..path.len() - 1];
    let Some(inner) = last.strip_prefix('{').and_then(|l| l.strip_suffix('}')) else {
        return vec![path.to_vec()];
    };
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let ib = inner.as_bytes();
    let mut items = Vec::new();
    for (k, b) in ib.iter().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                items.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    for item in items {
        // `a as b` is read as `a`: the path stops at the space.
        let item = item.trim();
        if item.is_empty() || item == "self" {
            out.push(head.to_vec());
            continue;
        }
        let (sub, _) = read_path(item);
        let mut full = head.to_vec();
        full.extend(sub.iter().cloned());
        out.extend(expand(&full));
    }
    out
}

/// A path from the crate root or from `module` (leading `super`s) as a
/// path from the crate root; `crate` and `self` dropped.
fn resolve_relative(module: &[String], path: &[String]) -> Vec<String> {
    let mut base: Vec<String> = if path.first().is_some_and(|p| p == "crate") {
        Vec::new()
    } else {
        module.to_vec()
    };
    for segment in path {
        match segment.as_str() {
            "crate" | "self" => {}
            "super" => {
                base.pop();
            }
            other => base.push(other.to_owned()),
        }
    }
    base
}

/// The longest prefix of `path` that is a module of a file.
fn file_of(modules: &BTreeSet<Vec<String>>, path: &[String]) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
}

/// Strongly connected parts of a graph with more than one node.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flatten()).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for next in edges.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for n in &nodes {
        if !reached[n].contains(*n) || out.iter().any(|c| c.contains(*n)) {
            continue;
        }
        let part: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reached[n].contains(**m) && reached[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if part.len() > 1 {
            out.push(part);
        }
    }
    out
}

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "lib".to_owned()
    } else {
        module.join("/")
    }
}

#[test]
fn no_file_in_runtime_src_imports_a_file_that_imports_it_back() {
    let sources = sources();
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in &sources {
        for path in paths_named(source) {
            if let Some(target) = file_of(&modules, &path)
                && target != source.module
                // A file's own submodules are its inside, not a neighbour.
                && !target.starts_with(&source.module)
                && !source.module.starts_with(&target)
            {
                edges
                    .entry(show(&source.module))
                    .or_default()
                    .insert(show(&target));
            }
        }
    }
    assert!(
        edges.values().map(BTreeSet::len).sum::<usize>() > 300,
        "the scan found too few imports: {edges:?}"
    );
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "files that reach each other through their imports (break each circle: move what both \
         need into a file of its own, or turn the call around): {found:#?}"
    );
}

#[test]
fn no_folder_in_runtime_src_reaches_itself_through_another() {
    let sources = sources();
    let folders: BTreeSet<String> = sources
        .iter()
        .filter_map(|s| s.module.first().cloned())
        .collect();
    // Which files make each folder-level edge, to name them on a failure.
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut made_by: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for source in &sources {
        let Some(from) = source.module.first() else {
            continue;
        };
        for path in paths_named(source) {
            if let Some(to) = path.first()
                && to != from
                && folders.contains(to)
            {
                edges.entry(from.clone()).or_default().insert(to.clone());
                made_by
                    .entry((from.clone(), to.clone()))
                    .or_default()
                    .insert(show(&source.module));
            }
        }
    }
    let made_by = &made_by;
    let found: Vec<String> = circles(&edges)
        .iter()
        .map(|part| {
            let inside: Vec<String> = part
                .iter()
                .flat_map(|a| {
                    edges
                        .get(a)
                        .into_iter()
                        .flatten()
                        .filter(|b| part.contains(*b))
                        .map(move |b| {
                            let files: Vec<&str> = made_by[&(a.clone(), b.clone())]
                                .iter()
                                .map(String::as_str)
                                .collect();
                            format!("{a} -> {b} (in {})", files.join(", "))
                        })
                })
                .collect();
            format!(
                "{{{}}}: {}",
                part.iter().cloned().collect::<Vec<_>>().join(", "),
                inside.join("; ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "folders of runtime/src that reach each other through their imports (a cycle; \
         ARCHITECTURE.md, \"Why it is built this way\", gives the order the folders keep and \
         how each loop was broken: turn the new edge around, or move what both sides need \
         into the lower one or a module of its own):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_scanner_reads_inline_paths_groups_and_supers() {
    let source = Source {
        module: vec!["broker".into(), "embedded".into(), "state".into()],
        code: "use super::commit::{group::Group, state_writes::{self, apply}};\n\
               fn f(x: crate::connect::SourceDef) -> super::super::dedup::Record {}\n"
            .into(),
    };
    let named: Vec<String> = paths_named(&source).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        named,
        [
            "broker::embedded::commit::group::Group",
            "broker::embedded::commit::state_writes",
            "broker::embedded::commit::state_writes::apply",
            "connect::SourceDef",
            "broker::dedup::Record",
        ]
    );
}
