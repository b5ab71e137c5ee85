//! A Python project on `sluice:plugin@0.2.0`: the world it is built
//! against, with only the capabilities its handler uses.
//!
//! componentize-py makes a component import every interface of the world
//! it is given, used or not, and the runtime refuses a component that
//! imports a capability its stage does not grant. So the contract's own
//! `handler` world (which imports `state` and `secrets`) would need both
//! grants on every stage. Instead the build writes a world of its own into
//! `target/wit-v0.2/` that imports the contract's `host`, the capabilities
//! the handler's source names (`sluice.state`, `sluice.secrets`,
//! `sluice.http`, or `from sluice import state`, ...) and nothing else, and
//! exports the handler's interface; the runtime sees the same imports and
//! exports as from the contract's world, less the unused capabilities.
//!
//! A project is on 0.2.0 when it has `wit/v0.2/plugin.wit` (`plugin new`
//! writes it); without it, it is built against `wit/plugin.wit` (0.1.0) as
//! before.

use std::path::{Path, PathBuf};

use crate::files::{PYTHON_WASI_HTTP, WIT_V0_2};
use crate::project::World;
use crate::{AuthorError, io};

/// The wasi:http version the SDK's client imports (the one the Rust SDK's
/// `wasip2` imports too).
pub const WASI_HTTP: &str = "0.2.12";

/// Where the build writes the generated world, inside the project.
pub const WORLD_DIR: &str = "target/wit-v0.2";

/// What a handler's source uses of the 0.2.0 capabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Uses {
    /// `sluice.state`.
    pub state: bool,
    /// `sluice.secrets`.
    pub secrets: bool,
    /// `sluice.http`.
    pub http: bool,
}

impl Uses {
    /// The capabilities, as the build stamp and messages name them.
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.state, "state"),
            (self.secrets, "secrets"),
            (self.http, "http"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// Whether the project in `dir` is on 0.2.0.
pub fn on_v0_2(dir: &Path) -> bool {
    dir.join(WIT_V0_2.0).is_file()
}

/// What the Python `sources` (relative path, text) use; the SDK itself
/// (`sluice.py` at the root) names every capability and is left out.
/// Comments are ignored, so a commented-out example imports nothing.
pub fn uses<'a>(sources: impl IntoIterator<Item = (&'a str, &'a str)>) -> Uses {
    let mut found = Uses::default();
    for (path, text) in sources {
        if path == "sluice.py" || !path.ends_with(".py") {
            continue;
        }
        let code: Vec<&str> = text.lines().map(strip_comment).collect();
        // `import sluice as s` makes `s.state` a use too.
        let mut prefixes = vec!["sluice".to_owned()];
        for line in &code {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["import", "sluice", "as", alias] = words.as_slice() {
                prefixes.push((*alias).to_owned());
            }
        }
        let mut importing = false;
        for line in &code {
            let trimmed = line.trim_start();
            let from_sluice = trimmed.starts_with("from sluice import");
            if from_sluice || importing {
                let names = if from_sluice {
                    &trimmed["from sluice import".len()..]
                } else {
                    trimmed
                };
                importing =
                    (from_sluice && names.contains('(') || importing) && !names.contains(')');
                for word in names.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '*')) {
                    match word {
                        "state" => found.state = true,
                        "secrets" => found.secrets = true,
                        "http" => found.http = true,
                        "*" => {
                            found = Uses {
                                state: true,
                                secrets: true,
                                http: true,
                            }
                        }
                        _ => {}
                    }
                }
            }
            for prefix in &prefixes {
                found.state |= names_attribute(line, prefix, "state");
                found.secrets |= names_attribute(line, prefix, "secrets");
                found.http |= names_attribute(line, prefix, "http");
            }
        }
    }
    found
}

/// `line` without a `#` comment (a `#` inside a string literal on the line
/// is kept).
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' => return &line[..i],
            None => {}
        }
    }
    line
}

/// Whether `line` has `prefix.name` as a whole attribute access.
fn names_attribute(line: &str, prefix: &str, name: &str) -> bool {
    let needle = format!("{prefix}.{name}");
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(&needle).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + needle.len()..].chars().next();
        !before.is_some_and(|c| ident(c) || c == '.') && !after.is_some_and(ident)
    })
}

/// The generated world: `host`, the capabilities used, the world's export.
pub fn world_wit(world: World, uses: Uses) -> Result<String, AuthorError> {
    if uses.state && world == World::BatchHandler {
        return Err(AuthorError::Invalid(
            "the handler uses `sluice.state`, and a batch handler (`BatchMessageHandler`) has \
             no state: a batch's items settle one by one, and a write shared by the batch \
             would have no single outcome to commit with. Use a handler of one message \
             (`MessageHandler = sluice.handler(handle)`) for state"
                .into(),
        ));
    }
    let mut wit = format!(
        "// Written by `sluice plugin build`: the contract's `{name}` world with only the\n\
         // capabilities the handler's source uses ({used}).\npackage local:python-app;\n\n\
         world {name} {{\n    import sluice:plugin/host@0.2.0;\n",
        name = world.name(),
        used = if uses.names().is_empty() {
            "none".to_owned()
        } else {
            uses.names().join(", ")
        },
    );
    if uses.state {
        wit.push_str("    import sluice:plugin/state@0.2.0;\n");
    }
    if uses.secrets {
        wit.push_str("    import sluice:plugin/secrets@0.2.0;\n");
    }
    if uses.http {
        wit.push_str(&format!(
            "    import wasi:http/outgoing-handler@{WASI_HTTP};\n"
        ));
    }
    let export = match world {
        World::Handler => "message-handler",
        World::BatchHandler => "batch-message-handler",
    };
    wit.push_str(&format!("    export sluice:plugin/{export}@0.2.0;\n}}\n"));
    Ok(wit)
}

/// Writes the generated world, the project's 0.2.0 contract and wasi:http's
/// WIT into [`WORLD_DIR`] and returns that directory (relative to the
/// project) and what the handler uses.
pub fn write_world(
    dir: &Path,
    world: World,
    sources: &[(String, String)],
) -> Result<(PathBuf, Uses), AuthorError> {
    let used = uses(sources.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let world_text = world_wit(world, used)?;
    let contract_path = dir.join(WIT_V0_2.0);
    let contract = std::fs::read_to_string(&contract_path)
        .map_err(io(format!("reading {}", contract_path.display())))?;
    let out = dir.join(WORLD_DIR);
    let _ = std::fs::remove_dir_all(&out);
    let mut files = vec![
        ("world.wit".to_owned(), world_text),
        ("deps/sluice-plugin/plugin.wit".to_owned(), contract),
    ];
    if used.http {
        files.extend(
            PYTHON_WASI_HTTP
                .iter()
                .map(|(path, text)| ((*path).to_owned(), (*text).to_owned())),
        );
    }
    for (path, text) in files {
        let path = out.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    }
    Ok((PathBuf::from(WORLD_DIR), used))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(source: &str) -> Uses {
        uses([("app.py", source)])
    }

    #[test]
    fn a_capability_is_used_when_the_source_names_it_outside_comments() {
        assert_eq!(
            used("import sluice\nx = sluice.log.info('state')\n"),
            Uses::default()
        );
        assert_eq!(
            used("n = sluice.state.increment('k')\n"),
            Uses {
                state: true,
                ..Uses::default()
            }
        );
        assert_eq!(
            used("# n = sluice.state.increment('k')\n    # sluice.http.get(url)\n"),
            Uses::default()
        );
        assert_eq!(
            used("t = sluice.secrets.get('t')  # then sluice.http.get(u)\n"),
            Uses {
                secrets: true,
                ..Uses::default()
            }
        );
        assert_eq!(
            used("u = 'a#b'; r = sluice.http.get(u)\n"),
            Uses {
                http: true,
                ..Uses::default()
            }
        );
        // Other names that merely start the same are not uses.
        assert_eq!(
            used("x = sluice.stateful; y = notsluice.state\n"),
            Uses::default()
        );
    }

    #[test]
    fn imports_and_aliases_count() {
        assert_eq!(
            used("from sluice import Emit, state, http\n"),
            Uses {
                state: true,
                http: true,
                ..Uses::default()
            }
        );
        assert_eq!(
            used("from sluice import (\n    Emit,\n    secrets,\n)\nstate = 1\n"),
            Uses {
                secrets: true,
                ..Uses::default()
            }
        );
        assert_eq!(
            used("import sluice as s\ns.http.post(u)\n"),
            Uses {
                http: true,
                ..Uses::default()
            }
        );
        assert_eq!(
            used("from sluice import *\n").names(),
            ["state", "secrets", "http"]
        );
        // The SDK names them all and is not the handler.
        assert_eq!(
            uses([("sluice.py", "sluice.state sluice.http"), ("app.py", "")]),
            Uses::default()
        );
        assert!(uses([("lib/helpers.py", "sluice.state.get(k)")]).state);
    }

    #[test]
    fn the_world_imports_only_what_is_used() {
        let plain = world_wit(World::Handler, Uses::default()).expect("world");
        assert!(
            plain.contains("import sluice:plugin/host@0.2.0;"),
            "{plain}"
        );
        assert!(plain.contains("export sluice:plugin/message-handler@0.2.0;"));
        for absent in ["state", "secrets", "wasi:http"] {
            assert!(!plain.contains(&format!("import {absent}")), "{plain}");
            assert!(
                !plain.contains(&format!("sluice:plugin/{absent}@")),
                "{plain}"
            );
        }
        let all = world_wit(
            World::Handler,
            Uses {
                state: true,
                secrets: true,
                http: true,
            },
        )
        .expect("world");
        for wanted in [
            "import sluice:plugin/state@0.2.0;",
            "import sluice:plugin/secrets@0.2.0;",
            "import wasi:http/outgoing-handler@0.2.12;",
        ] {
            assert!(all.contains(wanted), "{all}");
        }
        let batch = world_wit(
            World::BatchHandler,
            Uses {
                http: true,
                ..Uses::default()
            },
        )
        .expect("world");
        assert!(batch.contains("world batch-handler {"), "{batch}");
        assert!(batch.contains("export sluice:plugin/batch-message-handler@0.2.0;"));
        let err = world_wit(
            World::BatchHandler,
            Uses {
                state: true,
                ..Uses::default()
            },
        )
        .expect_err("no state in a batch")
        .to_string();
        assert!(err.contains("has no state"), "{err}");
    }

    #[test]
    fn the_carried_wasi_http_is_the_version_the_world_imports() {
        let http = PYTHON_WASI_HTTP
            .iter()
            .find(|(p, _)| p.ends_with("http.wit"))
            .expect("http.wit");
        assert!(
            http.1.contains(&format!("package wasi:http@{WASI_HTTP};")),
            "plugins/python/sdk/wasi-wit/http.wit is another version than WASI_HTTP"
        );
    }
}
