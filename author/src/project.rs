//! A plugin project: a directory whose language is told by the file that
//! holds the handler.
//!
//! | language | the handler | built with |
//! |---|---|---|
//! | Rust | `Cargo.toml` (a `cdylib` using `sluice-sdk`) | cargo, target `wasm32-wasip2` |
//! | Python | `app.py` (exports `MessageHandler`) | componentize-py |
//! | JavaScript | `handler.js` (exports `messageHandler`) | on QuickJS (`"sluice": { "engine": "quickjs" }` in `package.json`, what `plugin new` writes): nothing, the scripts go into the engine `sluice` carries; on SpiderMonkey (no engine named): componentize-js |
//!
//! A Python or JS project implements the `batch-handler` world when its
//! handler exports `BatchMessageHandler` / `batchMessageHandler`, else the
//! `handler` world; its WIT is `wit/plugin.wit` in the project.

use std::path::{Path, PathBuf};

use crate::{AuthorError, io};

/// A handler language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust, with the `sluice-sdk` crate.
    Rust,
    /// Python, with `sluice.py` and componentize-py.
    Python,
    /// JavaScript, with `sluice.js` and componentize-js.
    Js,
}

impl Lang {
    /// Every language, in the order help texts list them.
    pub const ALL: [Lang; 3] = [Lang::Rust, Lang::Python, Lang::Js];

    /// The name `--lang` takes.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }

    /// The language named `name` (`rust`, `python` or `py`, `js` or
    /// `javascript`).
    pub fn parse(name: &str) -> Option<Lang> {
        match name.to_ascii_lowercase().as_str() {
            "rust" | "rs" => Some(Lang::Rust),
            "python" | "py" => Some(Lang::Python),
            "js" | "javascript" => Some(Lang::Js),
            _ => None,
        }
    }

    /// The file whose presence marks a project in this language.
    pub fn marker(self) -> &'static str {
        match self {
            Lang::Rust => "Cargo.toml",
            Lang::Python => "app.py",
            Lang::Js => "handler.js",
        }
    }
}

impl std::fmt::Display for Lang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which world of the contract a project implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// One message per call.
    Handler,
    /// A batch of messages per call.
    BatchHandler,
}

impl World {
    /// The world's name in `wit/plugin.wit`.
    pub fn name(self) -> &'static str {
        match self {
            World::Handler => "handler",
            World::BatchHandler => "batch-handler",
        }
    }
}

/// The engine a JavaScript project's handler runs in, chosen in its
/// `package.json` (`"sluice": { "engine": "quickjs" }`).
///
/// `plugin new` writes QuickJS. A project that names no engine stays on
/// SpiderMonkey, as it was built before QuickJS existed: its
/// `node_modules` has componentize-js, and its handler may use what only
/// SpiderMonkey has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JsEngine {
    /// SpiderMonkey, through componentize-js (npm): the engine of a project
    /// that names none.
    #[default]
    SpiderMonkey,
    /// QuickJS: the project's scripts injected into an engine that
    /// `sluice` carries prebuilt; a call costs a fraction of SpiderMonkey's.
    QuickJs,
}

impl JsEngine {
    /// Every engine.
    pub const ALL: [JsEngine; 2] = [JsEngine::SpiderMonkey, JsEngine::QuickJs];

    /// The name `package.json` gives it.
    pub fn name(self) -> &'static str {
        match self {
            JsEngine::SpiderMonkey => "spidermonkey",
            JsEngine::QuickJs => "quickjs",
        }
    }

    /// The engine named `name`.
    pub fn parse(name: &str) -> Option<JsEngine> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// A plugin project found in a directory.
#[derive(Debug, Clone)]
pub struct Project {
    /// The project directory.
    pub dir: PathBuf,
    /// Its language.
    pub lang: Lang,
    /// Its name: the directory's name (Rust: cargo names the output).
    pub name: String,
}

impl Project {
    /// The project in `dir`, told by its marker file.
    ///
    /// # Errors
    ///
    /// [`AuthorError::NotAProject`] when `dir` holds none of the markers;
    /// [`AuthorError::Io`] when it cannot be read.
    pub fn detect(dir: &Path) -> Result<Project, AuthorError> {
        let meta = std::fs::metadata(dir).map_err(io(format!("reading {}", dir.display())))?;
        if !meta.is_dir() {
            return Err(AuthorError::NotAProject(format!(
                "{} is not a directory; `sluice plugin build` takes a project directory",
                dir.display()
            )));
        }
        let dir = std::fs::canonicalize(dir).map_err(io(format!("reading {}", dir.display())))?;
        let lang = Lang::ALL
            .into_iter()
            .find(|l| dir.join(l.marker()).is_file())
            .ok_or_else(|| {
                AuthorError::NotAProject(format!(
                    "{} is not a plugin project: it has no Cargo.toml (Rust), app.py (Python) \
                     or handler.js (JavaScript); create one with `sluice plugin new NAME --lang \
                     rust|python|js`",
                    dir.display()
                ))
            })?;
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(sanitize)
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "handler".to_owned());
        Ok(Project { dir, lang, name })
    }

    /// The world a Python or JS project implements (Rust: cargo's SDK
    /// macro decides, so this says [`World::Handler`]).
    ///
    /// # Errors
    ///
    /// When the handler file cannot be read.
    pub fn world(&self) -> Result<World, AuthorError> {
        let export = match self.lang {
            Lang::Rust => return Ok(World::Handler),
            Lang::Python => "BatchMessageHandler",
            Lang::Js => "batchMessageHandler",
        };
        let path = self.dir.join(self.lang.marker());
        let source =
            std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        Ok(if source.contains(export) {
            World::BatchHandler
        } else {
            World::Handler
        })
    }

    /// The engine a JS project asks for: `sluice.engine` in its
    /// `package.json`, SpiderMonkey when it names none.
    ///
    /// # Errors
    ///
    /// [`AuthorError::Invalid`] for a `package.json` that is not JSON or an
    /// engine that does not exist.
    pub fn js_engine(&self) -> Result<JsEngine, AuthorError> {
        let path = self.dir.join("package.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(JsEngine::default());
        };
        let doc: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| AuthorError::Invalid(format!("{}: {e}", path.display())))?;
        match &doc["sluice"]["engine"] {
            serde_json::Value::Null => Ok(JsEngine::default()),
            serde_json::Value::String(name) => JsEngine::parse(name).ok_or_else(|| {
                AuthorError::Invalid(format!(
                    "{}: unknown engine {name:?} under \"sluice\"; the engines are {}",
                    path.display(),
                    JsEngine::ALL.map(JsEngine::name).join(", ")
                ))
            }),
            other => Err(AuthorError::Invalid(format!(
                "{}: \"sluice\": {{ \"engine\" }} must be a string, not {other}",
                path.display()
            ))),
        }
    }

    /// Where a Python or JS build writes its component.
    pub fn output(&self) -> PathBuf {
        self.dir.join("target").join(format!("{}.wasm", self.name))
    }
}

/// A file-name-safe form of a directory name: lowercase letters, digits,
/// `-` and `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_language_by_its_marker_and_the_batch_world_by_its_export() {
        let root = tempfile_dir();
        for (lang, source, world) in [
            (
                Lang::Python,
                "MessageHandler = sluice.handler(h)\n",
                World::Handler,
            ),
            (
                Lang::Python,
                "BatchMessageHandler = sluice.batch_handler(h)\n",
                World::BatchHandler,
            ),
            (
                Lang::Js,
                "export const messageHandler = handler(h);\n",
                World::Handler,
            ),
            (
                Lang::Js,
                "export const batchMessageHandler = batchHandler(h);\n",
                World::BatchHandler,
            ),
            (Lang::Rust, "[package]\nname = \"x\"\n", World::Handler),
        ] {
            let dir = root.join(format!("My Plugin {}", world.name()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("test step");
            std::fs::write(dir.join(lang.marker()), source).expect("test step");
            let p = Project::detect(&dir).expect("test step");
            assert_eq!(p.lang, lang);
            assert_eq!(p.world().expect("test step"), world);
            assert_eq!(p.name, format!("my-plugin-{}", world.name()));
        }
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).expect("test step");
        let err = Project::detect(&empty).expect_err("must fail").to_string();
        assert!(err.contains("not a plugin project"), "{err}");
        assert!(err.contains("sluice plugin new"), "{err}");
        std::fs::remove_dir_all(root).expect("test step");
    }

    #[test]
    fn a_js_project_names_its_engine_in_package_json() {
        // Not under tempfile_dir(): the other test removes it when done.
        let dir = std::env::temp_dir().join(format!("sluice-author-engine-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test step");
        std::fs::write(dir.join("handler.js"), "").expect("test step");
        let engine = |package: Option<&str>| {
            let _ = std::fs::remove_file(dir.join("package.json"));
            if let Some(text) = package {
                std::fs::write(dir.join("package.json"), text).expect("test step");
            }
            Project::detect(&dir).expect("test step").js_engine()
        };
        assert_eq!(
            engine(None).expect("no package.json"),
            JsEngine::SpiderMonkey
        );
        assert_eq!(
            engine(Some("{}")).expect("none named"),
            JsEngine::SpiderMonkey
        );
        let quickjs = r#"{ "sluice": { "engine": "quickjs" } }"#;
        assert_eq!(engine(Some(quickjs)).expect("quickjs"), JsEngine::QuickJs);
        let err = engine(Some(r#"{ "sluice": { "engine": "v8" } }"#))
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("spidermonkey, quickjs"), "{err}");
        std::fs::remove_dir_all(dir).expect("test step");
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-author-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test step");
        dir
    }
}
