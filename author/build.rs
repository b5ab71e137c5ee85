//! Builds the QuickJS engine (`plugins/js/engine-quickjs`, both worlds) for
//! the `sluice` binary to carry, so that a JavaScript project on QuickJS
//! builds with no toolchain at all (`src/quickjs.rs` injects its scripts).
//!
//! It needs what `sluice plugin build` would need without it: cargo with
//! the `wasm32-wasip2` target, clang and wasi-libc's headers (or a
//! wasi-sdk), and crates.io or a warm cargo cache. When any is missing,
//! Sluice still builds: this prints a warning, and a QuickJS project's build
//! builds the engine itself, once. `SLUICE_PREBUILT_QUICKJS=0` skips it.

#[allow(dead_code)]
#[path = "src/toolchain.rs"]
mod toolchain;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use toolchain::{RUST_TARGET, SCRUBBED_ENV, WasmC};

/// The variable that turns the prebuilt engine off.
const SWITCH: &str = "SLUICE_PREBUILT_QUICKJS";

/// The engine's worlds: the constant in the generated file, the cargo
/// features and the output's name.
const WORLDS: [(&str, &[&str], &str); 2] = [
    ("HANDLER", &[], "quickjs-handler.wasm"),
    (
        "BATCH_HANDLER",
        &["--features", "batch"],
        "quickjs-batch-handler.wasm",
    ),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let repo = manifest_dir.parent().expect("author/ is in the repository");
    let engine = repo.join("plugins/js/engine-quickjs");
    for var in [SWITCH, "WASI_SDK", "WASI_SYSROOT"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    for path in [
        engine.join("src"),
        engine.join("Cargo.toml"),
        engine.join("Cargo.lock"),
        repo.join("plugins/sdk"),
        repo.join("plugins/Cargo.toml"),
        repo.join("wit"),
    ] {
        println!("cargo::rerun-if-changed={}", path.display());
    }

    let skipped = std::env::var(SWITCH).is_ok_and(|v| v == "0");
    let built = if skipped {
        Err(format!("{SWITCH}=0"))
    } else {
        build(&engine, &out)
    };
    let mut generated = String::from("// The prebuilt QuickJS engines, written by build.rs.\n");
    match &built {
        Ok(paths) => {
            for ((name, _, _), path) in WORLDS.iter().zip(paths) {
                let _ = writeln!(
                    generated,
                    "pub(super) const {name}: Option<&[u8]> = Some(include_bytes!({:?}));",
                    path.display().to_string()
                );
            }
        }
        Err(why) => {
            for (name, _, _) in WORLDS {
                let _ = writeln!(generated, "pub(super) const {name}: Option<&[u8]> = None;");
            }
            let retry = if skipped {
                String::new()
            } else {
                format!(
                    " Once these are installed here, rebuild Sluice (with {SWITCH}=1 if nothing \
                     else changed) to carry one."
                )
            };
            println!(
                "cargo::warning=no prebuilt QuickJS engine in this build ({why}): `sluice plugin \
                 build` will build one on the author's machine, once, which needs cargo with the \
                 {RUST_TARGET} target, clang and wasi-libc there.{retry}"
            );
        }
    }
    std::fs::write(out.join("quickjs_prebuilt.rs"), generated).expect("writing OUT_DIR");
}

/// Builds both worlds of the engine and copies them to `OUT_DIR`; says why
/// not when it cannot. Its target directory is `sluice-quickjs-engine` in
/// the outer target directory (the nearest ancestor of `OUT_DIR` that cargo
/// tagged `CACHEDIR.TAG`), so the dev, release and bench profiles share one
/// build of it (the engine is always built in release); `OUT_DIR` itself
/// when there is no such ancestor.
fn build(engine: &Path, out: &Path) -> Result<Vec<PathBuf>, String> {
    let missing = |m: toolchain::Missing| {
        watch_for_installs();
        format!("{} was not found; install it with: {}", m.tool, m.install)
    };
    let cargo = toolchain::cargo().map_err(missing)?;
    let c = WasmC::find().map_err(missing)?;
    let target = out
        .ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map_or_else(
            || out.join("quickjs-target"),
            |d| d.join("sluice-quickjs-engine"),
        );
    // Another profile's build script may build it at the same time: both
    // worlds write the same file, so one build (and copy) at a time.
    std::fs::create_dir_all(&target).map_err(|e| format!("creating {}: {e}", target.display()))?;
    let lock_path = target.join("build.lock");
    let lock = std::fs::File::create(&lock_path)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    let log_path = out.join("quickjs-build.log");
    std::fs::write(&log_path, "").map_err(|e| format!("writing {}: {e}", log_path.display()))?;
    let mut paths = Vec::new();
    for (_, features, name) in WORLDS {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let mut cmd = Command::new(&cargo);
        // First: the outer cargo's target directory is among them.
        scrub(&mut cmd);
        cmd.args(["build", "--release", "--locked", "--target", RUST_TARGET])
            .args(features)
            .arg("--manifest-path")
            .arg(engine.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        if let Ok(jobs) = std::env::var("NUM_JOBS") {
            cmd.args(["--jobs", &jobs]);
        }
        c.apply(&mut cmd);
        let status = cmd.status().map_err(|e| format!("running cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`cargo build` of plugins/js/engine-quickjs failed ({status}); its output is in {}",
                log_path.display()
            ));
        }
        let from = target
            .join(RUST_TARGET)
            .join("release")
            .join("sluice_js_quickjs.wasm");
        let to = out.join(name);
        std::fs::copy(&from, &to).map_err(|e| format!("copying {}: {e}", from.display()))?;
        paths.push(to);
    }
    drop(lock);
    Ok(paths)
}

/// Keeps the outer cargo's settings out of the engine's build: those
/// [`SCRUBBED_ENV`] names, and what cargo sets for a build script (this
/// package's and the host's cfg, features and directories).
fn scrub(cmd: &mut Command) {
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    const SET_FOR_BUILD_SCRIPTS: &[&str] = &[
        "OUT_DIR",
        "TARGET",
        "HOST",
        "NUM_JOBS",
        "OPT_LEVEL",
        "DEBUG",
        "PROFILE",
        "RUSTC_LINKER",
        "RUSTDOC",
    ];
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if SET_FOR_BUILD_SCRIPTS.contains(&&*name)
            || [
                "CARGO_CFG_",
                "CARGO_FEATURE_",
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
            ]
            .iter()
            .any(|p| name.starts_with(p))
        {
            cmd.env_remove(&var);
        }
    }
}

/// After a missing tool, reruns this script when one gets installed: the
/// rustup toolchain's component list (a new target), and the directories
/// clang and wasi-libc's headers land in.
fn watch_for_installs() {
    let sysroot = toolchain::tool_version(
        Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
            .args(["--print", "sysroot"]),
    );
    let mut watched: Vec<PathBuf> = sysroot
        .map(|s| Path::new(&s).join("lib/rustlib/components"))
        .into_iter()
        .collect();
    let nearest = |path: &Path| path.ancestors().find(|a| a.is_dir()).map(Path::to_owned);
    watched.extend(
        toolchain::SYSTEM_WASI_INCLUDES
            .iter()
            .take(1)
            .filter_map(|p| nearest(Path::new(p))),
    );
    watched.extend(nearest(Path::new("/usr/bin")));
    for path in watched
        .iter()
        .filter(|p| p.exists() && p != &Path::new("/"))
    {
        println!("cargo::rerun-if-changed={}", path.display());
    }
}
