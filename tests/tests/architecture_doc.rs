//! ARCHITECTURE.md's list of parts names every source file of the runtime
//! (issue 44): a reader who opens a file in `runtime/src` should find it
//! there. A file added without a line in the list, a line left for a file
//! that is gone, or a path in the text that names no file fails here.
//!
//! How the document writes a path, and so how this test reads it:
//! - In "The pieces", a line that starts with `runtime/src/engine/` opens
//!   that folder, and the entries indented under it name its files
//!   (`settle.rs`, `stage/intake.rs`), or a subfolder (`redis/`) whose files
//!   the rest of that entry names (`config.rs, source.rs (...), sink.rs`).
//!   A line that starts with `runtime/src/reload.rs` names that one file.
//! - A section headed with a folder (`runtime/src/broker/embedded/`) has a
//!   list of that folder's files, written the same way without the indent.
//! - In the text, a `.rs` path in backticks may be shortened to its last
//!   parts (`commit/group.rs`, `fetch.rs`), but some file must end so.

use std::collections::BTreeSet;
use std::path::Path;

const SRC: &str = "runtime/src/";

#[test]
fn architecture_doc_names_every_runtime_source_file() {
    let root = sluice_harness::repo_root();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let files = source_files(&root.join(SRC));
    let listed = listed_files(&doc);
    let mut problems = Vec::new();
    for file in files.difference(&listed) {
        let folder = file.rfind('/').map_or("", |end| &file[..=end]);
        problems.push(format!(
            "{SRC}{file} has no line: add a line for it to ARCHITECTURE.md's list of parts, \
             under {SRC}{folder}, saying in a few words what it does"
        ));
    }
    for file in listed.difference(&files) {
        problems.push(format!(
            "ARCHITECTURE.md's list of parts names {SRC}{file}, which does not exist: \
             correct the path, or take the line out if the file is gone"
        ));
    }
    for mention in mentions(&doc) {
        if !names_a_file(&mention, &files, &root) {
            problems.push(format!(
                "ARCHITECTURE.md's text names `{mention}`, and no file in {SRC} is or ends \
                 with that path: correct it to the file's current path"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md and {SRC} disagree ({} problems):\n  {}\n",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Whether a path the text names is a file of `runtime/src`: written in
/// full (`runtime/src/dlq.rs`), or shortened (`commit/group.rs`) and the
/// end of one. A path under another folder of the repository
/// (`tests/tests/storage_damage.rs`) is not this test's business.
fn names_a_file(mention: &str, files: &BTreeSet<String>, root: &Path) -> bool {
    if let Some(path) = mention.strip_prefix(SRC) {
        return files.contains(path);
    }
    let elsewhere = mention
        .split_once('/')
        .is_some_and(|(top, _)| root.join(top).is_dir());
    elsewhere
        || files
            .iter()
            .any(|file| file == mention || file.ends_with(&format!("/{mention}")))
}

/// Every `.rs` file under `dir`, as a path relative to it with `/`
/// between the parts (`broker/embedded/commit/group.rs`).
fn source_files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).expect("read a folder of runtime/src") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(dir).expect("under runtime/src");
                let parts: Vec<_> = relative
                    .components()
                    .map(|part| part.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.insert(parts.join("/"));
            }
        }
    }
    out
}

/// The files the document's lists name, relative to `runtime/src/`.
fn listed_files(doc: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_block = false;
    // The folder a section's heading names, if any.
    let mut section: Option<String> = None;
    // The folder whose entries the block is at: None outside runtime/src.
    let mut folder: Option<String> = None;
    // The folder the current entry's names are in.
    let mut entry: Option<String> = None;
    // Entries start at this indent; more is the same entry's next line.
    let mut entry_indent = 0;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            folder = section.clone();
            entry = section.clone();
            entry_indent = if section.is_some() { 0 } else { 2 };
            continue;
        }
        if !in_block {
            if line.starts_with('#') {
                section = heading_folder(line);
            }
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let first = line.split_whitespace().next().unwrap_or("");
        if indent < entry_indent {
            // `runtime/src/<folder>/`, `runtime/src/<file>.rs`, or a part
            // outside runtime/src (`harness/`).
            folder = first
                .strip_prefix(SRC)
                .map(|path| match path.ends_with('/') {
                    true => path.to_string(),
                    false => String::new(),
                });
            entry = folder.clone();
        } else if indent == entry_indent && !first.is_empty() {
            entry = folder.as_ref().map(|folder| match first.ends_with('/') {
                true => format!("{folder}{first}"),
                false => folder.clone(),
            });
        }
        let Some(entry) = &entry else { continue };
        for word in line.split(|c: char| !(c.is_alphanumeric() || "_./-".contains(c))) {
            if word.ends_with(".rs") {
                out.insert(match word.strip_prefix(SRC) {
                    Some(path) => path.to_string(),
                    None => format!("{entry}{word}"),
                });
            }
        }
    }
    out
}

/// `## The embedded broker (`runtime/src/broker/embedded/`)` is
/// `broker/embedded/`.
fn heading_folder(line: &str) -> Option<String> {
    let start = line.find(&format!("`{SRC}"))? + 1 + SRC.len();
    let path = &line[start..start + line[start..].find('`')?];
    path.ends_with('/').then(|| path.to_string())
}

/// The `.rs` paths the text outside the lists names in backticks.
fn mentions(doc: &str) -> BTreeSet<String> {
    let mut text = String::new();
    let mut in_block = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
        } else if !in_block {
            text.push_str(line);
            text.push('\n');
        }
    }
    // A span in backticks may run onto the next line, so the text is split
    // whole: every other piece is quoted.
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| quoted.ends_with(".rs") && !quoted.contains(char::is_whitespace))
        .map(str::to_string)
        .collect()
}
