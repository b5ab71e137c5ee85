//! `sluice plugin new`: a project that builds and passes its own test cases,
//! with everything it needs written into it (the WIT, the SDK), so it works
//! from any directory with only `sluice` and the language's toolchain.

use std::path::{Path, PathBuf};

use crate::files::{self, COMPONENTIZE_JS, COMPONENTIZE_PY, File, PREVIEW2_SHIM};
use crate::project::Lang;
use crate::{AuthorError, io};

const CASES: &str = include_str!("templates/common/cases.yaml");
const GITIGNORE: &str = include_str!("templates/common/gitignore");
const README: &str = include_str!("templates/common/README.md");

/// The longest project name accepted.
const MAX_NAME: usize = 64;

/// Creates the project `name` in `parent/name/` and returns its directory.
///
/// # Errors
///
/// [`AuthorError::Invalid`] for a bad name or a directory that exists and
/// is not empty (nothing is overwritten); [`AuthorError::Io`] on a write
/// error.
pub fn scaffold(parent: &Path, name: &str, lang: Lang) -> Result<PathBuf, AuthorError> {
    check_name(name)?;
    let dir = parent.join(name);
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(AuthorError::Invalid(format!(
            "{} already exists and is not empty; nothing was written (pick another name or \
             remove it)",
            dir.display()
        )));
    }
    for (path, text) in project_files(name, lang) {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    }
    Ok(dir)
}

/// A name is a valid crate name and a plain directory name.
fn check_name(name: &str) -> Result<(), AuthorError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(AuthorError::Invalid(format!(
            "invalid plugin name {name:?}: use lowercase letters, digits, `-` and `_`, starting \
             with a letter (at most {MAX_NAME} characters), e.g. `enrich-orders`"
        )))
    }
}

/// Every file of a new project, as (path inside it, text).
fn project_files(name: &str, lang: Lang) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = Vec::new();
    let mut add = |(path, text): File| files.push((path.to_owned(), text.to_owned()));
    add(files::WIT);
    add(("cases.yaml", CASES));
    add((".gitignore", GITIGNORE));
    match lang {
        Lang::Rust => {
            add(("Cargo.toml", include_str!("templates/rust/Cargo.toml")));
            add(("src/lib.rs", include_str!("templates/rust/src/lib.rs")));
            add(files::WIT_V0_2);
            files::RUST_SDK.iter().copied().for_each(&mut add);
        }
        Lang::Python => {
            add(("app.py", include_str!("templates/python/app.py")));
            add(files::PYTHON_SDK);
            // On 0.2.0: the build imports the capabilities the handler uses.
            add(files::WIT_V0_2);
        }
        Lang::Js => {
            add(("handler.js", include_str!("templates/js/handler.js")));
            add(("package.json", include_str!("templates/js/package.json")));
            add(files::WIT_V0_2);
        }
    }
    add(("README.md", README));
    if lang == Lang::Js {
        for (path, text) in files::js_sdk_v0_2() {
            files.push((path.to_owned(), text));
        }
    }
    let readme = readme_values(name, lang);
    files
        .into_iter()
        .map(|(path, text)| {
            let mut text = text.replace("{{name}}", name);
            if path == "README.md" {
                for (k, v) in &readme {
                    text = text.replace(&format!("{{{{{k}}}}}"), v);
                }
            }
            (path, text)
        })
        .collect()
}

/// The language-specific parts of the README.
fn readme_values(name: &str, lang: Lang) -> Vec<(&'static str, String)> {
    let (language, source, setup, tools, wasm, mapping, exception) = match lang {
        Lang::Rust => (
            "Rust",
            "src/lib.rs",
            String::new(),
            "cargo and the wasm32-wasip2 target (`rustup target add wasm32-wasip2`)".to_owned(),
            format!(
                "target/wasm32-wasip2/release/{}.wasm",
                name.replace('-', "_")
            ),
            "A handler is `fn(Message) -> Outcome`: `Ok(vec![Emit::to_default(bytes)])` to \
             emit (`Emit::new(topic, bytes)` for another declared topic; `.with_key`, \
             `.with_headers`), `Err(HandlerError::reject(reason))` to reject, \
             `Err(HandlerError::retry())` or `retry_after(duration)` to retry. \
             `msg.text()` and `msg.json()` reject what does not parse. The SDK is in \
             `vendor/sluice-sdk` (its docs: `cargo doc --open -p sluice-sdk`)."
                .to_owned(),
            "panic",
        ),
        Lang::Python => (
            "Python",
            "app.py",
            String::new(),
            format!(
                "componentize-py {COMPONENTIZE_PY} (`pip install componentize-py=={COMPONENTIZE_PY}`)"
            ),
            format!("target/{name}.wasm"),
            "A handler is `handle(msg)`, exported with `MessageHandler = sluice.handler(handle)`. \
             It returns `None` (nothing to emit), bytes, a str or a JSON value (one emit to the \
             default output), a `sluice.Emit(payload, topic=..., key=..., headers=...)`, or a \
             list of them; an emit without `key` or `headers` keeps the input's. \
             `raise sluice.Reject(reason)` rejects; `raise sluice.Retry()` (or \
             `Retry(after_ms)`) retries. `msg.text()` and `msg.json()` reject what does not \
             parse; `sluice.config(key, default)` reads the stage's `config:`; `sluice.log.info` \
             logs. `sluice.py` documents the rest.\n\n\
             The project is on contract 0.2.0 (`wit/v0.2/plugin.wit`): its capabilities are \
             `sluice.state` (the stage's key-value store, `state: true`), `sluice.secrets` \
             (`secrets: [name]`) and `sluice.http` (`http: {allow: [host]}`); the build imports \
             only those the code names (`app.py` shows each)."
                .to_owned(),
            "exception",
        ),
        Lang::Js => (
            "JavaScript",
            "handler.js",
            String::new(),
            "nothing else: `sluice` carries the QuickJS engine the handler runs in (a `sluice` \
             built without it builds it once, with cargo, the wasm32-wasip2 target, clang and \
             wasi-libc)"
                .to_owned(),
            format!("target/{name}.wasm"),
            format!(
                "A handler is `(msg) => result`, exported with `export const messageHandler = \
                 handler(fn)`. It returns `undefined` (nothing to emit), a Uint8Array, a string \
                 or a JSON value (one emit to the default output), a `new Emit(payload, {{ topic, \
                 key, headers }})`, or an array of them; an emit without `key` or `headers` keeps \
                 the input's, and headers may be an object. `throw new Reject(reason)` rejects; \
                 `throw new Retry()` (or `new Retry(afterMs)`) retries. `msg.text()` and \
                 `msg.json()` reject what does not parse; `config(key, fallback)` reads the \
                 stage's `config:`; `log.info` logs. `sluice.js` documents the rest.\n\n\
                 The project is on contract 0.2.0 (`wit/v0.2/plugin.wit`): its capabilities \
                 are `sluice-state.js` (the stage's key-value store, `state: true`), \
                 `sluice-secrets.js` (`secrets: [name]`) and the standard `fetch` (`http: \
                 {{ allow: [host] }}`) (`handler.js` shows each).\n\n\
                 The handler runs in QuickJS (`\"sluice\": {{ \"engine\": \"quickjs\" }}` in \
                 `package.json`): a call costs a fourth to a sixth of SpiderMonkey's, and the build \
                 only puts the project's `.js` and `.mjs` files into the engine `sluice` \
                 carries. That engine imports every capability: on a stage that does not grant \
                 one, each call of it fails with an error naming the stage and the grant to add. \
                 The same project also runs in SpiderMonkey (componentize-js), whose component \
                 imports only the capabilities the code uses, so a stage that does not grant \
                 one refuses it at load: set `\"engine\": \"spidermonkey\"` and `npm install \
                 --save-dev @bytecodealliance/componentize-js@{COMPONENTIZE_JS} \
                 @bytecodealliance/preview2-shim@{PREVIEW2_SHIM}`; its builds need Node.js \
                 then."
            ),
            "exception",
        ),
    };
    vec![
        ("language", language.to_owned()),
        ("source", source.to_owned()),
        ("setup", setup),
        ("tools", tools),
        ("wasm", wasm),
        ("mapping", mapping),
        ("exception", exception.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_plain_identifiers_are_refused() {
        for bad in [
            "",
            "Upper",
            "1st",
            "a b",
            "../x",
            "a/b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "enrich-orders", "my_plugin2"] {
            check_name(good).expect("test step");
        }
    }

    #[test]
    fn every_placeholder_is_filled_in_each_language() {
        for lang in Lang::ALL {
            for (path, text) in project_files("demo-x", lang) {
                assert!(!text.contains("{{"), "{lang}: {path} keeps a placeholder");
            }
        }
    }

    #[test]
    fn a_new_javascript_project_runs_on_quickjs() {
        let parent =
            std::env::temp_dir().join(format!("sluice-scaffold-js-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        let dir = scaffold(&parent, "q", Lang::Js).expect("test step");
        let project = crate::Project::detect(&dir).expect("test step");
        assert_eq!(
            project.js_engine().expect("test step"),
            crate::JsEngine::QuickJs
        );
        // The SDK is written in: no npm. On contract 0.2.0, and the
        // template's code (its comments aside) imports no capability, so
        // QuickJS runs it and any stage grants it.
        for sdk in ["sluice.js", "sluice-state.js", "sluice-secrets.js"] {
            assert!(dir.join(sdk).is_file(), "{sdk}");
        }
        let uses = crate::js::scan(&dir, "handler.js").expect("test step");
        assert_eq!(uses.contract().expect("one version"), crate::js::V0_2);
        let names: Vec<&str> = uses.interfaces.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["host"]);
        assert!(!uses.fetch, "fetch is only in the template's comments");
        std::fs::remove_dir_all(parent).expect("test step");
    }

    #[test]
    fn an_existing_project_is_never_overwritten() {
        let parent = std::env::temp_dir().join(format!("sluice-scaffold-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        let dir = scaffold(&parent, "p", Lang::Python).expect("test step");
        std::fs::write(dir.join("app.py"), "mine").expect("test step");
        let err = scaffold(&parent, "p", Lang::Js)
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("not empty"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("app.py")).expect("test step"),
            "mine"
        );
        std::fs::remove_dir_all(parent).expect("test step");
    }
}
