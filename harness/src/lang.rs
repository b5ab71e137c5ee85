//! The example and test-kit handlers written in Python and JavaScript, built
//! from source the way a user's project is (`sluice_author::build`, which
//! `sluice plugin build` runs too).
//!
//! Each is staged as a project in `<plugins-build>/<lang>/<name>/`: its
//! handler file, the language's SDK and the contract's WIT, copied from the
//! repository; a JS project also links `plugins/js/node_modules`, where
//! `cargo xtask setup` installed the pinned componentize-js, or, on
//! QuickJS, gets a `package.json` that names the engine. The build is
//! skipped while the staged inputs are unchanged, so the component's bytes
//! (and the daemon's compile cache) stay the same between test runs.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, bail};
use sluice_author::{JsEngine, Lang, Project};

/// A handler in another language than Rust.
#[derive(Debug, Clone, Copy)]
pub struct LangPlugin {
    /// The name [`crate::plugin`] takes and the component's file name.
    pub name: &'static str,
    /// Its language.
    pub lang: Lang,
    /// Its source directory, under `plugins/python` or `plugins/js`.
    pub source: &'static str,
    /// The engine a JavaScript handler is built for (its staged
    /// `package.json` names it); ignored for Python.
    pub engine: JsEngine,
}

/// Every handler built from `plugins/python` and `plugins/js`.
pub const LANG_PLUGINS: &[LangPlugin] = &[
    LangPlugin {
        name: "uppercase-py",
        lang: Lang::Python,
        source: "examples/uppercase",
        engine: JsEngine::SpiderMonkey,
    },
    LangPlugin {
        name: "router-py",
        lang: Lang::Python,
        source: "examples/router",
        engine: JsEngine::SpiderMonkey,
    },
    // No SDK: the raw componentize-py bindings.
    LangPlugin {
        name: "raw-py",
        lang: Lang::Python,
        source: "testkit/raw",
        engine: JsEngine::SpiderMonkey,
    },
    LangPlugin {
        name: "uppercase-js",
        lang: Lang::Js,
        source: "examples/uppercase",
        engine: JsEngine::SpiderMonkey,
    },
    LangPlugin {
        name: "router-js",
        lang: Lang::Js,
        source: "examples/router",
        engine: JsEngine::SpiderMonkey,
    },
    LangPlugin {
        name: "upper-batch-js",
        lang: Lang::Js,
        source: "examples/upper-batch",
        engine: JsEngine::SpiderMonkey,
    },
    // No SDK: the raw componentize-js bindings.
    LangPlugin {
        name: "raw-js",
        lang: Lang::Js,
        source: "testkit/raw",
        engine: JsEngine::SpiderMonkey,
    },
    // The same JavaScript on QuickJS (`plugins/js/engine-quickjs`).
    LangPlugin {
        name: "uppercase-qjs",
        lang: Lang::Js,
        source: "examples/uppercase",
        engine: JsEngine::QuickJs,
    },
    LangPlugin {
        name: "router-qjs",
        lang: Lang::Js,
        source: "examples/router",
        engine: JsEngine::QuickJs,
    },
    LangPlugin {
        name: "upper-batch-qjs",
        lang: Lang::Js,
        source: "examples/upper-batch",
        engine: JsEngine::QuickJs,
    },
    LangPlugin {
        name: "raw-qjs",
        lang: Lang::Js,
        source: "testkit/raw",
        engine: JsEngine::QuickJs,
    },
];

/// The language's directory under `plugins/`.
fn lang_dir(lang: Lang) -> PathBuf {
    let name = match lang {
        Lang::Python => "python",
        Lang::Js => "js",
        Lang::Rust => "rust",
    };
    crate::repo_root().join("plugins").join(name)
}

/// Builds every handler in [`LANG_PLUGINS`] and returns the components in
/// `target/plugins/`.
///
/// # Errors
///
/// When a toolchain is missing (run `cargo xtask setup`) or a build fails.
pub fn build_lang_plugins() -> anyhow::Result<Vec<PathBuf>> {
    LANG_PLUGINS.iter().map(build_lang_plugin).collect()
}

/// Builds one handler and copies it to `target/plugins/<name>.wasm`.
///
/// # Errors
///
/// When its toolchain is missing or the build fails.
pub fn build_lang_plugin(plugin: &LangPlugin) -> anyhow::Result<PathBuf> {
    let staged = stage(plugin)?;
    let project = Project::detect(&staged)?;
    let report = sluice_author::build(&project)
        .with_context(|| format!("building the {} handler {}", plugin.lang, plugin.name))?;
    let dest_dir = crate::plugins_dir();
    std::fs::create_dir_all(&dest_dir)
        .with_context(|| format!("creating {}", dest_dir.display()))?;
    crate::install(
        &report.wasm,
        &dest_dir.join(format!("{}.wasm", plugin.name)),
    )
}

/// Copies the handler, the SDK and the WIT into the staging project.
fn stage(plugin: &LangPlugin) -> anyhow::Result<PathBuf> {
    let lang = lang_dir(plugin.lang);
    let source = lang.join(plugin.source);
    let dir = crate::build_target_dir()
        .join(plugin.lang.name())
        .join(plugin.name);
    std::fs::create_dir_all(dir.join("wit"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let entries =
        std::fs::read_dir(&source).with_context(|| format!("reading {}", source.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_file() {
            copy_if_changed(&path, &dir.join(path.file_name().unwrap_or_default()))?;
        }
    }
    let sdk = match plugin.lang {
        Lang::Python => sluice_author::files::PYTHON_SDK,
        _ => sluice_author::files::JS_SDK,
    };
    write_if_changed(&dir.join(sdk.0), sdk.1)?;
    let wit = sluice_author::files::WIT;
    write_if_changed(&dir.join(wit.0), wit.1)?;
    if plugin.engine == JsEngine::QuickJs {
        let manifest = format!(
            "{{\n  \"private\": true,\n  \"type\": \"module\",\n  \"sluice\": {{ \"engine\": \"{}\" }}\n}}\n",
            plugin.engine.name()
        );
        write_if_changed(&dir.join("package.json"), &manifest)?;
    } else if plugin.lang == Lang::Js {
        let modules = lang.join("node_modules");
        if !modules
            .join("@bytecodealliance/componentize-js/package.json")
            .is_file()
        {
            bail!(
                "componentize-js is not installed in {}: run `cargo xtask setup` (it runs `npm ci` there)",
                lang.display()
            );
        }
        let link = dir.join("node_modules");
        if std::fs::read_link(&link).ok().as_deref() != Some(modules.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&modules, &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(dir)
}

fn copy_if_changed(from: &Path, to: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(from).with_context(|| format!("reading {}", from.display()))?;
    write_if_changed(to, &text)
}

fn write_if_changed(path: &Path, text: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The built handler `name`, for tests: built once per process.
///
/// # Panics
///
/// When the build fails: a test cannot run without its plugin.
pub(crate) fn plugin(name: &str) -> PathBuf {
    /// Each handler asked for so far, and how its build went.
    type Builds = Vec<(String, Result<PathBuf, String>)>;
    static BUILT: OnceLock<Mutex<Builds>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    // One build at a time: two tests asking at once share one build.
    let mut built = built
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, result)) = built.iter().find(|(n, _)| n == name) {
        return result.clone().unwrap_or_else(|e| panic!("{e}"));
    }
    let spec = LANG_PLUGINS
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("unknown handler {name:?}"));
    let result = build_lang_plugin(spec).map_err(|e| {
        format!(
            "building the {} handler {name:?} failed, so it is unavailable:\n{e:#}",
            spec.lang
        )
    });
    built.push((name.to_owned(), result.clone()));
    result.unwrap_or_else(|e| panic!("{e}"))
}
