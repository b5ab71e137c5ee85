//! No function in `runtime/src` runs over 150 lines, and every file there
//! over 800 lines has its line in ARCHITECTURE.md (issue 44, "Must show
//! 2"): a function that long does several things, and a file that long
//! must say what its one job is, or be split.
//!
//! A function's length counts from its `fn` line to its closing brace.
//! The scan blanks comments, strings and character literals, then matches
//! braces; `#[cfg(test)]` modules and files named `tests.rs` are tests, not
//! the runtime, and are skipped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The longest a function in `runtime/src` may be, in lines.
const MAX_FUNCTION_LINES: usize = 150;

/// A file longer than this must be named in ARCHITECTURE.md.
const LONG_FILE_LINES: usize = 800;

/// Functions over the limit today, as (file under `runtime/src`, function
/// name), each to be split by job. This list only shrinks: the test fails
/// on a function over the limit that is not listed, and on a listed one
/// that is no longer over it (take it off, so it cannot grow back).
const TOO_LONG_TODAY: &[(&str, &str)] = &[];

/// One function found: where, its name, its length in lines.
#[derive(Debug)]
struct Function {
    file: String,
    line: usize,
    name: String,
    lines: usize,
}

#[test]
fn no_function_in_runtime_src_is_over_150_lines() {
    let src = sluice_harness::repo_root().join("runtime/src");
    let mut functions = Vec::new();
    for (file, text) in source_files(&src) {
        functions.extend(functions_in(&file, &text));
    }
    assert!(
        functions.len() > 1000,
        "the scan found too few functions ({}): is it reading runtime/src?",
        functions.len()
    );
    let allowed: BTreeSet<(&str, &str)> = TOO_LONG_TODAY.iter().copied().collect();
    let mut problems = Vec::new();
    let mut still_long = BTreeSet::new();
    for f in functions.iter().filter(|f| f.lines > MAX_FUNCTION_LINES) {
        if allowed.contains(&(f.file.as_str(), f.name.as_str())) {
            still_long.insert((f.file.as_str(), f.name.as_str()));
            continue;
        }
        problems.push(format!(
            "runtime/src/{}:{}: fn {} is {} lines (at most {MAX_FUNCTION_LINES}): split it \
             into steps, each a function named for what it does",
            f.file, f.line, f.name, f.lines
        ));
    }
    for (file, name) in allowed.difference(&still_long) {
        problems.push(format!(
            "runtime/src/{file}: fn {name} is listed in TOO_LONG_TODAY and is no longer over \
             {MAX_FUNCTION_LINES} lines (or is gone): take it off the list"
        ));
    }
    assert!(
        problems.is_empty(),
        "functions over the limit ({} problems):\n  {}\n",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn every_long_file_in_runtime_src_is_named_in_architecture_md() {
    // architecture_doc.rs checks every file's line in full; this names the
    // long ones, which must say what their one job is there or be split.
    let root = sluice_harness::repo_root();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let words: BTreeSet<&str> = doc
        .split(|c: char| !(c.is_alphanumeric() || "_./-".contains(c)))
        .collect();
    let mut missing = Vec::new();
    for (file, text) in source_files(&root.join("runtime/src")) {
        let lines = text.lines().count();
        if lines <= LONG_FILE_LINES {
            continue;
        }
        let name = file.rsplit('/').next().unwrap_or(&file);
        let full = format!("runtime/src/{file}");
        let named = words.contains(full.as_str())
            || words
                .iter()
                .any(|w| *w == file || w.ends_with(&format!("/{file}")))
            || words.contains(name);
        if !named {
            missing.push(format!(
                "runtime/src/{file} ({lines} lines): name it in ARCHITECTURE.md with its one \
                 job, or split it"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "long files ARCHITECTURE.md does not name:\n  {}\n",
        missing.join("\n  ")
    );
}

#[test]
fn the_scanner_skips_comments_strings_chars_and_test_modules() {
    let text = r####"
fn short() -> &'static str {
    // a } in a comment
    /* and { in /* a nested */ block */
    let _c = '}';
    let _b = b'{';
    let _r = r#"a "}" in a raw string"#;
    "a { in a string \" }"
}

impl<'a> Thing<'a> {
    pub(crate) async fn method(&self, x: [u8; 4], f: fn() -> u8) -> u8 {
        x[0] + f()
    }
}

fn declared_only();

#[cfg(test)]
#[allow(clippy::all)]
mod tests {
    fn not_counted() {}
}
"####;
    let found: Vec<(String, usize, usize)> = functions_in("x.rs", text)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(
        found,
        [("short".to_owned(), 2, 8), ("method".to_owned(), 12, 3)]
    );
}

/// Every `.rs` file under `dir` but the test files (`tests.rs`), as its
/// path relative to `dir` (`/` between the parts) and its text.
fn source_files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).expect("read a folder of runtime/src") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs")
                && path.file_name().is_some_and(|name| name != "tests.rs")
            {
                let relative = path.strip_prefix(dir).expect("under runtime/src");
                let parts: Vec<_> = relative
                    .components()
                    .map(|part| part.as_os_str().to_string_lossy().into_owned())
                    .collect();
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.push((parts.join("/"), text));
            }
        }
    }
    out.sort();
    out
}

/// The functions with a body in `text`, outside `#[cfg(test)]` modules.
fn functions_in(file: &str, text: &str) -> Vec<Function> {
    let code = blank_non_code(text);
    let bytes = code.as_bytes();
    let line_at = |at: usize| 1 + bytes[..at].iter().filter(|b| **b == b'\n').count();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if starts_word(bytes, i, b"#[cfg(test)]") {
            // A test module's body is skipped whole; other test-only
            // items are read as code.
            let after = skip_attributes(bytes, i + b"#[cfg(test)]".len());
            if starts_word(bytes, after, b"mod")
                && let Some(open) = body_start(bytes, after)
            {
                i = matching_close(bytes, open) + 1;
                continue;
            }
        }
        if starts_word(bytes, i, b"fn") {
            let name_at = skip_space(bytes, i + 2);
            let name = ident_at(bytes, name_at);
            // `fn(..)` in a type names no function.
            if !name.is_empty()
                && let Some(open) = body_start(bytes, name_at)
            {
                let close = matching_close(bytes, open);
                let first = line_at(i);
                out.push(Function {
                    file: file.to_owned(),
                    line: first,
                    name: name.to_owned(),
                    lines: line_at(close) - first + 1,
                });
            }
            i = name_at.max(i + 2);
            continue;
        }
        i += 1;
    }
    out
}

/// `text` with comments, strings and character literals turned to spaces
/// (newlines kept, so lines still count), leaving only code.
fn blank_non_code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to.min(b.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            block_comment_end(b, i)
        } else if let Some(end) = raw_string_end(b, i) {
            end
        } else if rest[0] == b'"' {
            quoted_end(b, i, b'"')
        } else if rest[0] == b'\'' {
            match char_literal_end(b, i) {
                Some(end) => end,
                // A lifetime or a label: code.
                None => {
                    i += 1;
                    continue;
                }
            }
        } else {
            i += 1;
            continue;
        };
        blank(&mut out, i, end);
        i = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The end (exclusive) of the block comment at `i`; they nest.
fn block_comment_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0;
    while i < b.len() {
        if b[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if b[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The end of a raw string (`r"..."`, `r#"..."#`, `br#"..."#`) starting at
/// `i`, if one starts there.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && is_ident(b[i - 1]) {
        return None;
    }
    let mut j = i;
    if b.get(j) == Some(&b'b') || b.get(j) == Some(&b'c') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|c| **c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let mut closing = vec![b'"'];
    closing.extend(std::iter::repeat_n(b'#', hashes));
    let body = j + 1;
    Some(
        b[body..]
            .windows(closing.len())
            .position(|w| w == closing.as_slice())
            .map_or(b.len(), |at| body + at + closing.len()),
    )
}

/// The end of a string or character literal opened by `quote` at `i`.
fn quoted_end(b: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    b.len()
}

/// The end of the character literal at `i` (`'a'`, `'\n'`, `'\u{7f}'`,
/// `'é'`), or None where the quote starts a lifetime or a label.
fn char_literal_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        return Some(quoted_end(b, i, b'\''));
    }
    // One character, of one to four bytes, then the closing quote.
    (2..=5)
        .find(|len| {
            b.get(i + len) == Some(&b'\'')
                && std::str::from_utf8(&b[i + 1..i + len]).is_ok_and(|s| s.chars().count() == 1)
        })
        .map(|len| i + len + 1)
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `word` starts at `i`, not inside a longer identifier.
fn starts_word(b: &[u8], i: usize, word: &[u8]) -> bool {
    let ends_in_ident = word.last().is_some_and(|c| is_ident(*c));
    b[i..].starts_with(word)
        && (i == 0 || !is_ident(b[i - 1]))
        && !(ends_in_ident && b.get(i + word.len()).is_some_and(|c| is_ident(*c)))
}

/// The first byte after the whitespace and attributes (`#[...]`) at `i`.
fn skip_attributes(b: &[u8], mut i: usize) -> usize {
    loop {
        i = skip_space(b, i);
        if !b[i..].starts_with(b"#[") {
            return i;
        }
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b'[' => depth += 1,
                b']' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

fn ident_at(b: &[u8], i: usize) -> &str {
    let len = b[i..].iter().take_while(|c| is_ident(**c)).count();
    std::str::from_utf8(&b[i..i + len]).unwrap_or("")
}

/// The `{` that opens the body of the item whose header starts at `i`, or
/// None when a `;` ends it first (a declaration without a body). Brackets
/// and parentheses in the header (`[u8; 4]`) are stepped over.
fn body_start(b: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b'{' if depth == 0 => return Some(i),
            b';' if depth == 0 => return None,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The `}` that closes the `{` at `open` (the end of the text if none).
fn matching_close(b: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (at, c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return at;
                }
            }
            _ => {}
        }
    }
    b.len() - 1
}
