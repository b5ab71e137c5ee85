//! Build support shared by the tests, the benchmarks and `cargo xtask`: builds
//! the Wasm plugins in `plugins/` from source and says where they are; and,
//! in [`nats`], real nats-server processes for end-to-end tests, in
//! [`moto`], a real S3 API (moto's server), in [`azurite`], Azure Blob
//! Storage (Azurite), in [`fake_gcs`], GCS's JSON API (fake-gcs-server),
//! in [`postgres`], a real
//! Postgres server of the test's own, in [`redis`], real redis-servers,
//! in [`mosquitto`], real MQTT brokers, in [`rabbitmq`], a private
//! RabbitMQ node, and in [`kafka`], Apache Kafka (one node or a cluster of
//! three) from its Maven Central jars.
//!
//! The plugins live in their own cargo workspace (`plugins/Cargo.toml`) and are
//! compiled for `wasm32-wasip2`, so a plain `cargo test` never builds them.
//! Tests ask for one by name instead, and get a fresh component:
//!
//! ```no_run
//! let wasm = sluice_harness::plugin("uppercase");
//! // .../target/plugins/uppercase.wasm
//! ```
//!
//! [`plugin`] builds every plugin once per process. Cargo makes a repeated
//! build cheap (a no-op when nothing changed) and never serves a stale
//! component, so tests always run the plugins' current source. The build uses
//! its own target directory (`target/plugins-build`): calling it from a
//! running `cargo test` would otherwise wait forever on the outer build's lock.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, bail};
// The Rust target every plugin is compiled for.
use sluice_author::build::RUST_TARGET as TARGET;

pub mod azurite;
pub mod fake_gcs;
pub mod kafka;
mod lang;
pub mod mosquitto;
pub mod moto;
pub mod nats;
pub mod postgres;
pub mod process;
pub mod rabbitmq;
pub mod redis;
pub mod served;
pub mod skip;

pub use lang::{LANG_PLUGINS, build_lang_plugin, build_lang_plugins};

/// Every plugin built from `plugins/`, by the name [`plugin`] takes (the
/// crate name, with hyphens).
pub const PLUGINS: &[&str] = &[
    // Examples.
    "uppercase",
    "router",
    "charge",
    "enrich",
    "window",
    "upper-batch",
    // Test kit.
    "identity",
    "identity-batch",
    "fail",
    "spin",
    "membomb",
    "stackbomb",
    "bigout",
    "sleepy",
    "escape",
    "notahandler",
    "future-version",
    "crunch",
    "chatty",
    "short-batch",
    "stamp",
    "digest",
    "secret-reader",
    "stateful",
    "fetcher",
];

/// The repository root (the directory of the root `Cargo.toml`), so paths work
/// whatever the current directory of a test or of xtask is.
///
/// Read at run time from the directory of the package cargo runs (a test,
/// a bench, xtask: each a member directly under the root), and only
/// without one from this crate's directory at build time: a target
/// directory shared by two checkouts (CI's cache) can hold a build of this
/// crate made in the other checkout, whose baked-in path points there.
pub fn repo_root() -> PathBuf {
    let is_root = |dir: &Path| dir.join("Cargo.toml").is_file() && dir.join("harness").is_dir();
    let member = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|member| member.parent().is_some_and(is_root))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    member
        .parent()
        .map_or_else(|| member.clone(), Path::to_path_buf)
}

/// Where the built components are copied: `<root>/target/plugins`.
pub(crate) fn plugins_dir() -> PathBuf {
    repo_root().join("target").join("plugins")
}

/// The plugin build's own target directory, never the calling build's.
pub(crate) fn build_target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => repo_root().join(dir).join("plugins-build"),
        _ => repo_root().join("target").join("plugins-build"),
    }
}

/// Builds every plugin in release mode for `wasm32-wasip2` and copies each
/// component to `<root>/target/plugins/<name>.wasm`, returning those paths.
///
/// Runs `cargo build --release --target wasm32-wasip2 --manifest-path
/// plugins/Cargo.toml` (with `$CARGO` if set) in the target directory
/// `$CARGO_TARGET_DIR/plugins-build`, or `<root>/target/plugins-build`.
/// Cargo's messages are echoed to stderr (and so captured by the test harness).
///
/// # Errors
///
/// When cargo cannot be run or the build fails (the error names the command,
/// and suggests `rustup target add wasm32-wasip2` when the target is missing),
/// when a plugin in [`PLUGINS`] was not produced, when an output is not a
/// component, or when copying fails.
pub fn build_plugins() -> anyhow::Result<Vec<PathBuf>> {
    let root = repo_root();
    let cargo = std::env::var_os("CARGO")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cargo".into());
    let manifest = root.join("plugins").join("Cargo.toml");
    let target_dir = build_target_dir();

    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--release", "--target", TARGET])
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(&manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in sluice_author::build::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    // Our own target directory, never the calling build's (scrubbed above).
    cmd.env("CARGO_TARGET_DIR", &target_dir);
    let shown = format!(
        "CARGO_TARGET_DIR={} {} build --release --target {TARGET} --manifest-path {}",
        target_dir.display(),
        Path::new(&cargo).display(),
        manifest.display(),
    );

    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not run `{shown}`"))?;
    let (stdout, stderr) = match (child.stdout.take(), child.stderr.take()) {
        (Some(out), Some(err)) => (out, err),
        _ => bail!("`{shown}`: cargo's output was not captured"),
    };
    // Read both pipes at once so that neither can fill up and stall cargo.
    let (messages, diagnostics) = std::thread::scope(|s| {
        let messages = s.spawn(move || {
            let mut json = String::new();
            BufReader::new(stdout)
                .read_to_string(&mut json)
                .map(|_| json)
        });
        let diagnostics = echo_lines(stderr);
        (messages.join(), diagnostics)
    });
    let status = child
        .wait()
        .with_context(|| format!("`{shown}` did not finish"))?;
    if !status.success() {
        let mut msg = format!("`{shown}` failed ({status})");
        if target_missing(&diagnostics) {
            msg.push_str(&format!(
                "\nhint: the {TARGET} target is not installed; run `rustup target add {TARGET}`"
            ));
        }
        bail!(msg);
    }
    let messages = match messages {
        Ok(read) => read.with_context(|| format!("`{shown}`: reading cargo's output"))?,
        Err(_) => bail!("`{shown}`: the thread reading cargo's output panicked"),
    };

    let produced = wasm_artifacts(&messages)?;
    for name in PLUGINS {
        if !produced.iter().any(|(n, _)| n == name) {
            bail!(
                "`{shown}` succeeded but produced no `{name}` component: is it a member of {}?",
                manifest.display()
            );
        }
    }

    let dest_dir = plugins_dir();
    std::fs::create_dir_all(&dest_dir)
        .with_context(|| format!("creating {}", dest_dir.display()))?;
    produced
        .iter()
        .map(|(name, built)| install(built, &dest_dir.join(format!("{name}.wasm"))))
        .collect()
}

/// Echoes each line of cargo's stderr to ours while keeping a copy.
fn echo_lines(stderr: impl Read) -> String {
    let mut all = String::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        eprintln!("{line}");
        all.push_str(&line);
        all.push('\n');
    }
    all
}

/// Whether cargo's diagnostics say the Wasm target's standard library is absent.
fn target_missing(diagnostics: &str) -> bool {
    diagnostics.contains("target may not be installed")
        || diagnostics.contains("can't find crate for `core`")
        || diagnostics.contains("can't find crate for `std`")
}

/// The `.wasm` files cargo reported building, as `(plugin name, path)`: the
/// file name with underscores turned back into the crate's hyphens.
fn wasm_artifacts(messages: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut found = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let msg: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("bad cargo message: {line}"))?;
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let files = msg["filenames"].as_array().into_iter().flatten();
        for file in files.filter_map(serde_json::Value::as_str) {
            let path = PathBuf::from(file);
            if path.extension().is_some_and(|e| e == "wasm")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                found.push((stem.replace('_', "-"), path));
            }
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// Copies a built component to `dest` unless it is already there. The copy is
/// made beside `dest` and renamed over it, so a concurrent test process never
/// reads a half-written file.
pub(crate) fn install(built: &Path, dest: &Path) -> anyhow::Result<PathBuf> {
    let bytes = std::fs::read(built).with_context(|| format!("reading {}", built.display()))?;
    // Bytes 4..8 of a component are its version and layer: 0x0d 0 1 0.
    // A core module (01 00 00 00) cannot be loaded as a plugin.
    if bytes.get(..4) != Some(&b"\0asm"[..])
        || bytes.get(4..8) != Some(&[0x0d, 0x00, 0x01, 0x00][..])
    {
        bail!(
            "{} is not a WebAssembly component (was it built for {TARGET}?)",
            built.display()
        );
    }
    if std::fs::read(dest).is_ok_and(|old| old == bytes) {
        return Ok(dest.to_path_buf());
    }
    let tmp = dest.with_extension(format!("wasm.tmp{}", std::process::id()));
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    Ok(dest.to_path_buf())
}

/// The path of the freshly built plugin `name` (one of [`PLUGINS`]), for tests.
///
/// The first call in a process builds all plugins (see [`build_plugins`]);
/// later calls reuse that build.
///
/// # Panics
///
/// If `name` is not in [`PLUGINS`], or if the build failed: a test cannot run
/// without its plugin, and the message says why.
pub fn plugin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if LANG_PLUGINS.iter().any(|p| p.name == name) {
        return lang::plugin(name);
    }
    if !PLUGINS.contains(&name) {
        panic!(
            "unknown plugin {name:?}; the plugins are: {}, {}",
            PLUGINS.join(", "),
            LANG_PLUGINS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let built = BUILT.get_or_init(|| build_plugins().map(drop).map_err(|e| format!("{e:#}")));
    if let Err(e) = built {
        panic!("building the Wasm plugins failed, so plugin {name:?} is unavailable:\n{e}");
    }
    plugins_dir().join(format!("{name}.wasm"))
}
