//! What the `sluice` binary carries so that a project can be created and
//! built outside this repository: the contract's WIT and the SDK of each
//! language, as they are in the repository (compiled in, so they can never
//! disagree with the runtime that loads the result), and the QuickJS engine,
//! prebuilt when the machine that built Sluice could build it (`build.rs`),
//! as sources otherwise.

use crate::World;

/// A file to write into a project: its path inside the project, its text.
pub type File = (&'static str, &'static str);

/// The contract, `sluice:plugin@0.1.0`. Every project has it at
/// `wit/plugin.wit`.
pub const WIT: File = ("wit/plugin.wit", include_str!("../../wit/plugin.wit"));

/// The contract `sluice:plugin@0.2.0`, with the capabilities (state,
/// secrets; `wasi:http` beside it), which the Rust SDK is built on: a Rust
/// project has it at `wit/v0.2/plugin.wit`.
pub const WIT_V0_2: File = (
    "wit/v0.2/plugin.wit",
    include_str!("../../wit/v0.2/plugin.wit"),
);

/// The Python SDK, a single module beside `app.py`.
pub const PYTHON_SDK: File = (
    "sluice.py",
    include_str!("../../plugins/python/sdk/sluice.py"),
);

/// wasi:http's WIT (0.2.12, with wasi:io and wasi:clocks, which it uses),
/// for a Python project on 0.2.0 whose handler makes requests: the build
/// writes it beside the world it generates ([`crate::python`]), as paths
/// inside that world's directory.
pub const PYTHON_WASI_HTTP: &[File] = &[
    (
        "deps/wasi-http/http.wit",
        include_str!("../../plugins/python/sdk/wasi-wit/http.wit"),
    ),
    (
        "deps/wasi-io/io.wit",
        include_str!("../../plugins/python/sdk/wasi-wit/io.wit"),
    ),
    (
        "deps/wasi-clocks/clocks.wit",
        include_str!("../../plugins/python/sdk/wasi-wit/clocks.wit"),
    ),
];

/// The JavaScript SDK on contract 0.1.0, a single module beside
/// `handler.js`.
pub const JS_SDK: File = ("sluice.js", include_str!("../../plugins/js/sdk/sluice.js"));

/// The JavaScript SDK's capability modules (contract 0.2.0), beside
/// `sluice.js`: a handler imports the ones it uses, and its component
/// imports only those capabilities.
pub const JS_CAPABILITIES: &[File] = &[
    (
        "sluice-state.js",
        include_str!("../../plugins/js/sdk/sluice-state.js"),
    ),
    (
        "sluice-secrets.js",
        include_str!("../../plugins/js/sdk/sluice-secrets.js"),
    ),
];

/// The JavaScript SDK on contract 0.2.0: `sluice.js` importing
/// `sluice:plugin/host@0.2.0`, and [`JS_CAPABILITIES`].
pub fn js_sdk_v0_2() -> Vec<(&'static str, String)> {
    let mut files = vec![(
        JS_SDK.0,
        JS_SDK
            .1
            .replace(JS_HOST_V0_1, "\"sluice:plugin/host@0.2.0\""),
    )];
    files.extend(JS_CAPABILITIES.iter().map(|(p, t)| (*p, (*t).to_owned())));
    files
}

/// The specifier of the host import in [`JS_SDK`].
const JS_HOST_V0_1: &str = "\"sluice:plugin/host@0.1.0\"";

/// The componentize-py release the Python SDK is written and tested
/// against.
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// The componentize-js release the JavaScript SDK is written and tested
/// against.
pub const COMPONENTIZE_JS: &str = "0.23.0";

/// The preview2-shim release componentize-js imports without declaring it
/// (jco lists it as an optional peer only), so a project pins it itself or
/// `npm ci` leaves it out and componentize-js cannot start.
pub const PREVIEW2_SHIM: &str = "0.25.0";

/// The Rust SDK, vendored into `vendor/sluice-sdk/` of a Rust project until
/// it is published. Its bindings read `../../wit/v0.2`, which from there is
/// the project's own `wit/v0.2/`.
pub const RUST_SDK: &[File] = &[
    ("vendor/sluice-sdk/Cargo.toml", RUST_SDK_MANIFEST),
    (
        "vendor/sluice-sdk/src/lib.rs",
        include_str!("../../plugins/sdk/src/lib.rs"),
    ),
    (
        "vendor/sluice-sdk/src/config.rs",
        include_str!("../../plugins/sdk/src/config.rs"),
    ),
    (
        "vendor/sluice-sdk/src/error.rs",
        include_str!("../../plugins/sdk/src/error.rs"),
    ),
    (
        "vendor/sluice-sdk/src/http.rs",
        include_str!("../../plugins/sdk/src/http.rs"),
    ),
    (
        "vendor/sluice-sdk/src/secrets.rs",
        include_str!("../../plugins/sdk/src/secrets.rs"),
    ),
    (
        "vendor/sluice-sdk/src/state.rs",
        include_str!("../../plugins/sdk/src/state.rs"),
    ),
    (
        "vendor/sluice-sdk/src/log.rs",
        include_str!("../../plugins/sdk/src/log.rs"),
    ),
    (
        "vendor/sluice-sdk/src/message.rs",
        include_str!("../../plugins/sdk/src/message.rs"),
    ),
];

/// The QuickJS engine for JavaScript handlers (`plugins/js/engine-quickjs`),
/// without its manifest: see [`quickjs_engine`].
const QUICKJS_ENGINE: &[File] = &[
    (
        "Cargo.lock",
        include_str!("../../plugins/js/engine-quickjs/Cargo.lock"),
    ),
    (
        "src/lib.rs",
        include_str!("../../plugins/js/engine-quickjs/src/lib.rs"),
    ),
    (
        "src/capabilities.rs",
        include_str!("../../plugins/js/engine-quickjs/src/capabilities.rs"),
    ),
];

/// The engine's manifest in the repository, whose SDK is `../../sdk`.
const QUICKJS_MANIFEST: &str = include_str!("../../plugins/js/engine-quickjs/Cargo.toml");

/// The QuickJS engine crate as `sluice plugin build` writes it out to
/// build it: its sources, the Rust SDK vendored beside them and the WIT
/// the SDK reads (`vendor/sluice-sdk/../../wit/v0.2`).
pub fn quickjs_engine() -> Vec<(&'static str, String)> {
    let manifest = QUICKJS_MANIFEST.replace(
        r#"sluice-sdk = { path = "../../sdk""#,
        r#"sluice-sdk = { path = "vendor/sluice-sdk""#,
    );
    let mut files = vec![
        ("Cargo.toml", manifest),
        (WIT.0, WIT.1.to_owned()),
        (WIT_V0_2.0, WIT_V0_2.1.to_owned()),
    ];
    files.extend(
        QUICKJS_ENGINE
            .iter()
            .chain(RUST_SDK)
            .map(|(path, text)| (*path, (*text).to_owned())),
    );
    files
}

mod prebuilt {
    include!(concat!(env!("OUT_DIR"), "/quickjs_prebuilt.rs"));
}

/// The QuickJS engine for `world`, built with this binary (`build.rs`,
/// `cargo build --release --target wasm32-wasip2` of
/// `plugins/js/engine-quickjs`), with an empty script area for
/// [`crate::quickjs::inject`]. None when the machine that built Sluice
/// could not build it, or `SLUICE_PREBUILT_QUICKJS=0` said not to: a
/// QuickJS project's build then builds the engine from
/// [`quickjs_engine`], once.
pub fn quickjs_prebuilt(world: World) -> Option<&'static [u8]> {
    match world {
        World::Handler => prebuilt::HANDLER,
        World::BatchHandler => prebuilt::BATCH_HANDLER,
    }
}

/// The vendored SDK's manifest: the repository's, without the workspace
/// inheritance a standalone project cannot resolve.
const RUST_SDK_MANIFEST: &str = r#"[package]
name = "sluice-sdk"
description = "Guest SDK for Sluice: write a stream handler as a plain Rust function and export it as a Wasm component."
version = "0.1.0"
edition = "2024"
rust-version = "1.95"
license = "Apache-2.0"
publish = false

[lib]
name = "sluice_sdk"

[features]
default = ["json"]
# JSON helpers: `Message::json` and `Emit::json`.
json = ["dep:serde", "dep:serde_json"]

[dependencies]
serde = { version = "1", default-features = false, features = ["std"], optional = true }
serde_json = { version = "1", optional = true }
wit-bindgen = { version = "0.61.1", default-features = false, features = ["macros", "realloc", "std"] }
wasip2 = { version = "2", default-features = false, features = ["std"] }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quickjs_engine_is_written_out_with_the_vendored_sdk() {
        let files = quickjs_engine();
        let manifest = &files[0].1;
        assert!(
            manifest.contains(r#"sluice-sdk = { path = "vendor/sluice-sdk""#),
            "the engine's manifest moved its SDK dependency: update quickjs_engine"
        );
        for wanted in [
            "wit/plugin.wit",
            "wit/v0.2/plugin.wit",
            "src/lib.rs",
            "vendor/sluice-sdk/src/lib.rs",
        ] {
            assert!(files.iter().any(|(p, _)| *p == wanted), "{wanted}");
        }
    }

    #[test]
    fn every_source_of_the_quickjs_engine_is_carried() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../plugins/js/engine-quickjs/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(src)
            .expect("test step")
            .map(|e| {
                format!(
                    "src/{}",
                    e.expect("test step").file_name().to_string_lossy()
                )
            })
            .collect();
        on_disk.sort();
        let mut carried: Vec<String> = QUICKJS_ENGINE
            .iter()
            .map(|(p, _)| (*p).to_owned())
            .filter(|p| p.starts_with("src/"))
            .collect();
        carried.sort();
        assert_eq!(
            carried, on_disk,
            "a file was added to plugins/js/engine-quickjs/src: carry it in QUICKJS_ENGINE"
        );
    }

    #[test]
    fn the_javascript_sdk_on_0_2_imports_host_at_0_2_only() {
        assert_eq!(JS_SDK.1.matches(JS_HOST_V0_1).count(), 1);
        let files = js_sdk_v0_2();
        let sdk = &files[0].1;
        assert!(
            !sdk.contains("@0.1.0"),
            "sluice.js on 0.2.0 still names 0.1.0"
        );
        assert!(sdk.contains(r#"from "sluice:plugin/host@0.2.0";"#));
        let names: Vec<&str> = files.iter().map(|(p, _)| *p).collect();
        assert_eq!(names, ["sluice.js", "sluice-state.js", "sluice-secrets.js"]);
    }

    #[test]
    fn the_vendored_sdk_asks_for_what_the_repository_sdk_uses() {
        let repo = include_str!("../../plugins/Cargo.toml");
        assert!(
            repo.contains(r#"wit-bindgen = { version = "0.61.1""#),
            "the plugins workspace moved wit-bindgen: update RUST_SDK_MANIFEST"
        );
        let sdk = include_str!("../../plugins/sdk/src/lib.rs");
        assert!(sdk.contains(r#"path: "../../wit/v0.2""#));
        assert!(
            repo.contains(r#"wasip2 = { version = "2""#),
            "the plugins workspace moved wasip2: update RUST_SDK_MANIFEST"
        );
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(src)
            .expect("test step")
            .map(|e| {
                format!(
                    "vendor/sluice-sdk/src/{}",
                    e.expect("test step").file_name().to_string_lossy()
                )
            })
            .collect();
        on_disk.sort();
        let mut carried: Vec<String> = RUST_SDK[1..].iter().map(|(p, _)| (*p).to_owned()).collect();
        carried.sort();
        assert_eq!(
            carried, on_disk,
            "a file was added to plugins/sdk/src: carry it here"
        );
    }
}
