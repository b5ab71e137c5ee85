//! What a JavaScript project's code asks of the contract, read from its
//! modules before a build: which version of `sluice:plugin` it imports,
//! which of its interfaces (a capability is one: state, secrets), and
//! whether it uses `fetch` (outbound HTTP).
//!
//! componentize-js imports every interface of the world it is given, used
//! or not, and a stage refuses a component that imports a capability it
//! does not grant. So a build on contract 0.2.0 gives componentize-js a
//! world of its own with only what the code imports: the modules reachable
//! from `handler.js` through relative imports, scanned for their import
//! specifiers and the name `fetch` outside comments and strings.

use std::collections::BTreeSet;
use std::path::Path;

use crate::project::World;
use crate::{AuthorError, io};

/// The contract's package.
const PACKAGE: &str = "sluice:plugin/";

/// What a project's modules use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uses {
    /// The `sluice:plugin` interfaces imported, as (interface, version):
    /// `("state", "0.2.0")`.
    pub interfaces: BTreeSet<(String, String)>,
    /// Whether a module names `fetch` (in code, not a comment or string).
    pub fetch: bool,
    /// The modules read, relative to the project.
    pub modules: Vec<String>,
}

/// The contract versions the SDKs speak.
pub const V0_1: &str = "0.1.0";
/// The contract with capabilities.
pub const V0_2: &str = "0.2.0";

impl Uses {
    /// The one contract version the modules import (0.1.0 when they import
    /// none).
    ///
    /// # Errors
    ///
    /// [`AuthorError::Invalid`] when they import two versions, or one that
    /// does not exist.
    pub fn contract(&self) -> Result<&str, AuthorError> {
        let versions: BTreeSet<&str> = self.interfaces.iter().map(|(_, v)| v.as_str()).collect();
        match versions.into_iter().collect::<Vec<_>>()[..] {
            [] => Ok(V0_1),
            [v] if v == V0_1 || v == V0_2 => Ok(v),
            [v] => Err(AuthorError::Invalid(format!(
                "the handler imports sluice:plugin@{v}; the contract versions are {V0_1} and {V0_2}"
            ))),
            ref several => Err(AuthorError::Invalid(format!(
                "the handler's modules import sluice:plugin at {}: a component implements one \
                 version; the SDK's sluice.js and the modules beside it must come from the same \
                 `sluice plugin new`",
                several.join(" and ")
            ))),
        }
    }

    /// The capabilities the modules use, as a stage grants them: `state`,
    /// `secrets`, `http` (`fetch`).
    pub fn capabilities(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .interfaces
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| !matches!(*name, "host" | "types"))
            .collect();
        if self.fetch {
            names.push("http (`fetch`)");
        }
        names
    }

    /// The WIT of a world for componentize-js that imports the contract's
    /// `host` and the capabilities the modules import, and exports
    /// `world`'s interface: added to the contract's package as a file of its
    /// own.
    ///
    /// # Errors
    ///
    /// [`AuthorError::Invalid`] for `state` in a batch handler, or an
    /// interface the contract does not have.
    pub fn world_wit(&self, world: World) -> Result<String, AuthorError> {
        let mut imports = vec!["host"];
        for (name, _) in &self.interfaces {
            match name.as_str() {
                "host" | "types" => {}
                "state" if world == World::BatchHandler => {
                    return Err(AuthorError::Invalid(
                        "a batch handler cannot use state (sluice:plugin/state is in the \
                         `handler` world only: a batch's items settle one by one); export a \
                         `messageHandler` instead"
                            .to_owned(),
                    ));
                }
                "state" => imports.push("state"),
                "secrets" => imports.push("secrets"),
                other => {
                    return Err(AuthorError::Invalid(format!(
                        "the handler imports sluice:plugin/{other}@{V0_2}, which the contract \
                         does not have (its capabilities are state and secrets; HTTP is `fetch`)"
                    )));
                }
            }
        }
        let export = match world {
            World::Handler => "message-handler",
            World::BatchHandler => "batch-message-handler",
        };
        // No comment above `package`: the contract's file documents it, and
        // a package is documented once.
        let mut wit = format!(
            "package sluice:plugin@{V0_2};\n\n\
             // Written by `sluice plugin build`: the world of this build, which imports\n\
             // only what the handler's modules use.\n\
             world {BUILD_WORLD} {{\n"
        );
        for import in imports {
            wit.push_str(&format!("    import {import};\n"));
        }
        wit.push_str(&format!("    export {export};\n}}\n"));
        Ok(wit)
    }
}

/// The name of the world [`Uses::world_wit`] writes.
pub const BUILD_WORLD: &str = "sluice-build";

/// What the modules reachable from `entry` (relative to `dir`) use.
///
/// # Errors
///
/// [`AuthorError::Io`] when a module cannot be read; a relative import of
/// a file that does not exist is left to the engine to report.
pub fn scan(dir: &Path, entry: &str) -> Result<Uses, AuthorError> {
    let mut uses = Uses::default();
    let mut todo = vec![entry.to_owned()];
    let mut seen = BTreeSet::new();
    while let Some(rel) = todo.pop() {
        if !seen.insert(rel.clone()) {
            continue;
        }
        let path = dir.join(&rel);
        if !path.is_file() {
            continue;
        }
        let source =
            std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        let found = scan_source(&source);
        uses.fetch |= found.fetch;
        for spec in found.specifiers {
            if spec.starts_with("./") || spec.starts_with("../") {
                if let Some(next) = join(&rel, &spec) {
                    todo.push(next);
                }
            } else if let Some(rest) = spec.strip_prefix(PACKAGE) {
                let (name, version) = rest.split_once('@').unwrap_or((rest, ""));
                uses.interfaces
                    .insert((name.to_owned(), version.to_owned()));
            }
        }
        uses.modules.push(rel);
    }
    Ok(uses)
}

/// `spec` resolved against the module `base`, both relative to the
/// project; None when it leaves the project.
fn join(base: &str, spec: &str) -> Option<String> {
    let mut parts: Vec<&str> = base.split('/').collect();
    parts.pop();
    for part in spec.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop()?;
            }
            _ => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// What one module's code holds.
#[derive(Debug, Default, PartialEq, Eq)]
struct Found {
    /// The specifiers of `import ... from "x"`, `export ... from "x"`,
    /// `import "x"` and `import("x")`.
    specifiers: Vec<String>,
    /// Whether the identifier `fetch` occurs.
    fetch: bool,
}

/// A token of JavaScript, as far as [`scan_source`] needs one.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Str(String),
    Punct(char),
}

/// Reads the import specifiers and whether `fetch` is named, skipping
/// comments, strings and template literals. A regular expression literal
/// is read as punctuation, which is enough unless it holds a quote.
fn scan_source(source: &str) -> Found {
    let tokens = tokens(source);
    let mut found = Found::default();
    for (i, token) in tokens.iter().enumerate() {
        let Token::Word(word) = token else { continue };
        let next = tokens.get(i + 1);
        match (word.as_str(), next) {
            ("fetch", _) => found.fetch = true,
            ("from" | "import", Some(Token::Str(spec))) => found.specifiers.push(spec.clone()),
            ("import", Some(Token::Punct('('))) => {
                if let Some(Token::Str(spec)) = tokens.get(i + 2) {
                    found.specifiers.push(spec.clone());
                }
            }
            _ => {}
        }
    }
    found
}

fn tokens(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if c == '"' || c == '\'' || c == '`' {
            let mut text = String::new();
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = chars.get(i) {
                    text.push(ch);
                }
                i += 1;
            }
            i += 1;
            // A template literal's text is not a specifier.
            if c != '`' {
                out.push(Token::Str(text));
            } else {
                out.push(Token::Punct('`'));
            }
        } else if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            out.push(Token::Word(chars[start..i].iter().collect()));
        } else {
            if !c.is_whitespace() {
                out.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_are_read_from_code_and_not_from_comments_or_strings() {
        let found = scan_source(
            r#"// import * as state from "./sluice-state.js"; fetch(x)
/* import "./nope.js" */
import { handler } from "./sluice.js";
import * as secrets from './sluice-secrets.js';
export { a } from "./lib/a.mjs";
import "sluice:plugin/state@0.2.0";
const lazy = import("./lazy.js");
const s = "import x from \"./in-a-string.js\"; fetch";
const t = `from "./template.js"`;
"#,
        );
        assert_eq!(
            found.specifiers,
            [
                "./sluice.js",
                "./sluice-secrets.js",
                "./lib/a.mjs",
                "sluice:plugin/state@0.2.0",
                "./lazy.js"
            ]
        );
        assert!(!found.fetch, "fetch only in a comment and a string");
        assert!(scan_source("const r = await fetch(url);").fetch);
        assert!(!scan_source("const prefetch = 1; fetched();").fetch);
    }

    #[test]
    fn relative_imports_resolve_inside_the_project_only() {
        assert_eq!(
            join("handler.js", "./lib/a.js").as_deref(),
            Some("lib/a.js")
        );
        assert_eq!(join("lib/a.js", "../b.js").as_deref(), Some("b.js"));
        assert_eq!(join("handler.js", "../../etc/x.js"), None);
    }

    #[test]
    fn the_build_world_imports_what_the_modules_import() {
        let dir = std::env::temp_dir().join(format!("sluice-js-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let write = |p: &str, s: &str| {
            let path = dir.join(p);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("test step");
            std::fs::write(path, s).expect("test step");
        };
        write(
            "handler.js",
            "import { handler } from \"./sluice.js\";\nimport * as state from \"./lib/s.js\";\n\
             export const messageHandler = handler(async () => (await fetch(\"x\")).text());",
        );
        write(
            "sluice.js",
            "import { log } from \"sluice:plugin/host@0.2.0\";\n// from \"./sluice-secrets.js\"",
        );
        write(
            "lib/s.js",
            "import * as raw from \"sluice:plugin/state@0.2.0\";\nimport \"./s.js\";",
        );
        write(
            "sluice-secrets.js",
            "import * as raw from \"sluice:plugin/secrets@0.2.0\";",
        );
        let uses = scan(&dir, "handler.js").expect("scan");
        assert_eq!(uses.contract().expect("one version"), V0_2);
        assert!(uses.fetch);
        assert_eq!(uses.capabilities(), ["state", "http (`fetch`)"]);
        let wit = uses.world_wit(World::Handler).expect("a world");
        assert!(
            wit.contains("import host;\n    import state;\n    export message-handler;"),
            "{wit}"
        );
        assert!(!wit.contains("secrets"), "not imported: {wit}");
        let err = uses
            .world_wit(World::BatchHandler)
            .expect_err("state in a batch");
        assert!(
            err.to_string().contains("batch handler cannot use state"),
            "{err}"
        );

        write(
            "lib/s.js",
            "import * as raw from \"sluice:plugin/host@0.1.0\";",
        );
        let mixed = scan(&dir, "handler.js").expect("scan");
        let err = mixed.contract().expect_err("two versions");
        assert!(err.to_string().contains("0.1.0 and 0.2.0"), "{err}");

        write(
            "handler.js",
            "export const messageHandler = { handle() {} };",
        );
        let raw = scan(&dir, "handler.js").expect("scan");
        assert_eq!(raw.contract().expect("none"), V0_1);
        assert!(!raw.fetch);
        std::fs::remove_dir_all(&dir).expect("test step");
    }
}
