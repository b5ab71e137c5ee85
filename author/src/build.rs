//! Building a project into a component with its language's own toolchain,
//! or, for JavaScript on QuickJS, with none: its scripts are injected into
//! the engine `sluice` carries ([`crate::quickjs`]).
//!
//! Nothing is installed behind the user's back: a missing tool is reported
//! as [`AuthorError::ToolMissing`] with the command that installs it. The
//! tools' own output goes to stderr, so a caller's stdout stays its own.
//!
//! A Python or JS build is skipped when its inputs (every file of the
//! project but `target/`, `node_modules/`, `__pycache__/` and dot-files, the
//! world and the tool's version or the engine's hash) hash to what the
//! last build recorded in `target/<name>.wasm.inputs`: componentize-py and
//! componentize-js never give the same bytes twice, so an unchanged project
//! would otherwise cost a fresh compile in every daemon that loads it.
//! Cargo makes that decision itself for Rust.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::files::{COMPONENTIZE_JS, COMPONENTIZE_PY, PREVIEW2_SHIM};
use crate::project::{JsEngine, Lang, Project, World};
use crate::toolchain::{WasmC, tool_version};
use crate::{AuthorError, io};

pub use crate::toolchain::{RUST_TARGET, SCRUBBED_ENV};

/// The WASI features componentize-js links by default that Sluice does not
/// offer to a component on contract 0.1.0: without `-d http -d
/// fetch-event` the component imports `wasi:http` and cannot load.
pub const JS_DISABLED_FEATURES: &[&str] = &["http", "fetch-event"];

/// Where a build on contract 0.2.0 writes the WIT it gives componentize-js
/// (the contract, and a world of what the handler imports), under the
/// project's `target/`.
const JS_BUILD_WIT: &str = "target/wit-v0.2";

/// What a build produced.
#[derive(Debug, Clone)]
pub struct BuildReport {
    /// The component.
    pub wasm: PathBuf,
    /// False when the last build's output was still current.
    pub rebuilt: bool,
}

/// Builds `project` and returns where its component is.
///
/// # Errors
///
/// [`AuthorError::ToolMissing`] naming the tool and its install command;
/// [`AuthorError::BuildFailed`] when the tool ran and failed (its output
/// went to stderr); [`AuthorError::Io`] on a file error.
pub fn build(project: &Project) -> Result<BuildReport, AuthorError> {
    match project.lang {
        Lang::Rust => build_rust(project),
        Lang::Js if project.js_engine()? == JsEngine::QuickJs => build_quickjs(project),
        Lang::Python | Lang::Js => build_componentized(project),
    }
}

/// A JS build on QuickJS: the project's `.js` and `.mjs` files are
/// injected into a built engine ([`crate::quickjs`]), which takes
/// milliseconds. The engine is the one this binary carries
/// ([`crate::files::quickjs_prebuilt`]), else one built here once
/// ([`local_quickjs_engine`]).
fn build_quickjs(project: &Project) -> Result<BuildReport, AuthorError> {
    let world = project.world()?;
    let prebuilt = crate::files::quickjs_prebuilt(world);
    let engine_id = match prebuilt {
        Some(engine) => format!("prebuilt {}", blake3::hash(engine).to_hex()),
        None => format!("local {}", engine_hashes().1),
    };
    let uses = crate::js::scan(&project.dir, Lang::Js.marker())?;
    uses.contract()?;
    // The engine imports every capability of its world: nothing to choose,
    // but a batch handler has no state, and an interface the contract
    // lacks is a mistake to say now rather than at the first message.
    uses.world_wit(world)?;
    let stamp = inputs_hash(&project.dir, &[world.name(), "quickjs", &engine_id])?;
    let output = Stamped::new(project, stamp)?;
    if let Some(fresh) = output.fresh() {
        return Ok(fresh);
    }
    let mut scripts = Vec::new();
    for (rel, path) in sources(&project.dir)? {
        if rel.ends_with(".js") || rel.ends_with(".mjs") {
            let bytes = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
            scripts.push((rel, bytes));
        }
    }
    let local;
    let engine = match prebuilt {
        Some(engine) => engine,
        None => {
            local = local_quickjs_engine(world)?;
            &local
        }
    };
    let component = crate::quickjs::inject(engine, &crate::quickjs::bundle(&scripts))?;
    std::fs::write(&output.tmp, component)
        .map_err(io(format!("writing {}", output.tmp.display())))?;
    output.finish()
}

/// Hashes of the engine crate's files, as [`crate::files::quickjs_engine`]
/// writes them out: of its manifest and lock alone (what its dependencies
/// are), and of all.
fn engine_hashes() -> (String, String) {
    let hash = |files: &mut dyn Iterator<Item = &(&str, String)>| {
        let mut hasher = blake3::Hasher::new();
        for (path, text) in files {
            hasher
                .update(path.as_bytes())
                .update(b"\0")
                .update(text.as_bytes());
        }
        hasher.finalize().to_hex()[..16].to_owned()
    };
    let engine = crate::files::quickjs_engine();
    let deps = hash(&mut engine.iter().filter(|(p, _)| p.starts_with("Cargo.")));
    (deps, hash(&mut engine.iter()))
}

/// The QuickJS engine for `world`, built here by a `sluice` that carries
/// none: cargo builds the engine crate once per source and world, in a
/// cache shared by every project (so QuickJS's C sources compile once too),
/// and keeps the result there.
fn local_quickjs_engine(world: World) -> Result<Vec<u8>, AuthorError> {
    let (deps, all) = engine_hashes();
    // Named by the dependencies alone: a new engine source rebuilds the
    // engine crate in place, not QuickJS's C sources in a new directory.
    let dir = cache_dir().join(format!("js-quickjs-{deps}"));
    let kept = dir.join(format!("engine-{all}-{}.wasm", world.name()));
    if let Ok(engine) = std::fs::read(&kept) {
        return Ok(engine);
    }
    let needs = |m: crate::toolchain::Missing| AuthorError::ToolMissing {
        tool: format!(
            "{} (this sluice carries no prebuilt QuickJS engine, so the first QuickJS build \
             builds one)",
            m.tool
        ),
        install: m.install,
    };
    let cargo = crate::toolchain::cargo().map_err(needs)?;
    let c = WasmC::find().map_err(needs)?;
    for (path, text) in &crate::files::quickjs_engine() {
        let path = dir.join(path);
        if std::fs::read_to_string(&path).is_ok_and(|old| old == *text) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    }
    // Two builds at once would share the engine's one output file.
    let lock_path = dir.join("build.lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(io(format!("creating {}", lock_path.display())))?;
    lock.lock()
        .map_err(io(format!("locking {}", lock_path.display())))?;
    if let Ok(engine) = std::fs::read(&kept) {
        return Ok(engine);
    }
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&dir)
        .args(["build", "--release", "--target", RUST_TARGET]);
    if world == World::BatchHandler {
        cmd.args(["--features", "batch"]);
    }
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env("CARGO_TARGET_DIR", dir.join("target"));
    c.apply(&mut cmd);
    run(&mut cmd, None)?;
    let built = dir
        .join("target")
        .join(RUST_TARGET)
        .join("release")
        .join("sluice_js_quickjs.wasm");
    let engine = std::fs::read(&built).map_err(io(format!("reading {}", built.display())))?;
    let tmp = kept.with_extension(format!("wasm.tmp{}", std::process::id()));
    std::fs::write(&tmp, &engine).map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &kept).map_err(io(format!("writing {}", kept.display())))?;
    drop(lock);
    Ok(engine)
}

/// Where builds keep what every project shares: `$SLUICE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`.
fn cache_dir() -> PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("SLUICE_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("sluice")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("sluice")))
        .unwrap_or_else(|| std::env::temp_dir().join("sluice-cache"))
}

/// A Python or JS build: skipped when the inputs are unchanged.
fn build_componentized(project: &Project) -> Result<BuildReport, AuthorError> {
    let world = project.world()?;
    let (mut cmd, version) = match project.lang {
        Lang::Python => python_command(project, world)?,
        _ => js_command(project, world)?,
    };
    let stamp = inputs_hash(&project.dir, &[world.name(), &version])?;
    let output = Stamped::new(project, stamp)?;
    if let Some(fresh) = output.fresh() {
        return Ok(fresh);
    }
    cmd.arg("-o").arg(&output.tmp);
    run(&mut cmd, None)?;
    output.finish()
}

/// A build's output (`target/NAME.wasm`) with the hash of the inputs it
/// comes from beside it (`NAME.wasm.inputs`): a build whose inputs did not
/// change is skipped, and a new output is written to a temporary file and
/// moved into place before its hash is recorded, so a failed build never
/// leaves an output that looks current.
struct Stamped {
    /// The output.
    out: PathBuf,
    /// Where the build writes it first.
    tmp: PathBuf,
    /// The hash of the inputs.
    stamp: String,
}

impl Stamped {
    /// The output of `project` for inputs hashing to `stamp`; creates its
    /// directory.
    fn new(project: &Project, stamp: String) -> Result<Stamped, AuthorError> {
        let out = project.output();
        let dir = out.parent().unwrap_or(&project.dir);
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let tmp = out.with_extension(format!("wasm.tmp{}", std::process::id()));
        Ok(Stamped { out, tmp, stamp })
    }

    fn stamp_path(&self) -> PathBuf {
        self.out.with_extension("wasm.inputs")
    }

    /// The output, when it was built from these same inputs.
    fn fresh(&self) -> Option<BuildReport> {
        let same = std::fs::read_to_string(self.stamp_path()).is_ok_and(|s| s.trim() == self.stamp);
        (self.out.is_file() && same).then(|| BuildReport {
            wasm: self.out.clone(),
            rebuilt: false,
        })
    }

    /// Moves the finished build into place and records its inputs.
    fn finish(self) -> Result<BuildReport, AuthorError> {
        std::fs::rename(&self.tmp, &self.out)
            .map_err(io(format!("writing {}", self.out.display())))?;
        let stamp_path = self.stamp_path();
        std::fs::write(&stamp_path, format!("{}\n", self.stamp))
            .map_err(io(format!("writing {}", stamp_path.display())))?;
        Ok(BuildReport {
            wasm: self.out,
            rebuilt: true,
        })
    }
}

/// `componentize-py -d wit -w WORLD componentize app -p .`, and the tool's
/// version. A project on 0.2.0 (with `wit/v0.2/plugin.wit`) is built
/// against the world [`crate::python::write_world`] writes, which imports
/// only the capabilities its handler uses; the version then names them, so
/// the build stamp changes with them.
fn python_command(project: &Project, world: World) -> Result<(Command, String), AuthorError> {
    let install = format!("pip install componentize-py=={COMPONENTIZE_PY}");
    let version = tool_version(Command::new("componentize-py").arg("--version"))
        .ok_or_else(|| missing("componentize-py", &install))?;
    warn_version("componentize-py", &version, COMPONENTIZE_PY, &install);
    let mut cmd = Command::new("componentize-py");
    cmd.current_dir(&project.dir);
    let mut stamp = version;
    if crate::python::on_v0_2(&project.dir) {
        let mut texts = Vec::new();
        for (rel, path) in sources(&project.dir)? {
            if rel.ends_with(".py") {
                let text = std::fs::read_to_string(&path)
                    .map_err(io(format!("reading {}", path.display())))?;
                texts.push((rel, text));
            }
        }
        let (wit, uses) = crate::python::write_world(&project.dir, world, &texts)?;
        cmd.arg("-d").arg(wit);
        stamp = format!(
            "{stamp} v0.2 wasi:http@{} [{}]",
            crate::python::WASI_HTTP,
            uses.names().join(",")
        );
    } else {
        cmd.args(["-d", "wit"]);
    }
    cmd.args(["-w", world.name(), "componentize", "app", "-p", "."])
        .env("PYTHONDONTWRITEBYTECODE", "1");
    Ok((cmd, stamp))
}

/// `node componentize-js handler.js -w wit -n WORLD -d http -d fetch-event`
/// on contract 0.1.0; on 0.2.0 (what the modules import says, [`crate::js`])
/// `-w target/wit-v0.2 -n sluice-build -d fetch-event`, with `-d http` too
/// unless the code uses `fetch`. And the tool's version.
fn js_command(project: &Project, world: World) -> Result<(Command, String), AuthorError> {
    let node_version = tool_version(Command::new("node").arg("--version")).ok_or_else(|| {
        missing(
            "node (Node.js)",
            "your system's package manager (e.g. `apt install nodejs npm`), Node.js 18 or newer",
        )
    })?;
    let Some(cli) = find_componentize_js(&project.dir) else {
        return Err(missing(
            "componentize-js",
            &format!(
                "`npm install --save-dev @bytecodealliance/componentize-js@{COMPONENTIZE_JS} \
                 @bytecodealliance/preview2-shim@{PREVIEW2_SHIM}` in {} (or `npm install` when \
                 its package.json pins them); or leave SpiderMonkey for QuickJS, which needs \
                 neither: `\"sluice\": {{ \"engine\": \"quickjs\" }}` in package.json",
                project.dir.display()
            ),
        ));
    };
    let version =
        probe_version(Command::new("node").arg(&cli).arg("--version")).map_err(|detail| {
            AuthorError::ToolBroken {
                tool: format!("componentize-js ({})", cli.display()),
                detail,
                install: "`rm -rf node_modules && npm install` in the project directory".to_owned(),
            }
        })?;
    warn_version(
        "componentize-js",
        &version,
        COMPONENTIZE_JS,
        &format!("npm install --save-dev @bytecodealliance/componentize-js@{COMPONENTIZE_JS}"),
    );
    let mut cmd = Command::new("node");
    cmd.current_dir(&project.dir).arg(&cli).arg("handler.js");
    let uses = crate::js::scan(&project.dir, Lang::Js.marker())?;
    if uses.contract()? == crate::js::V0_1 {
        cmd.args(["-w", "wit", "-n", world.name()]);
        for feature in JS_DISABLED_FEATURES {
            cmd.args(["-d", feature]);
        }
    } else {
        js_build_wit(project, &uses, world)?;
        cmd.args(["-w", JS_BUILD_WIT, "-n", crate::js::BUILD_WORLD]);
        // No server side; the client side (`fetch`) when the code uses it.
        cmd.args(["-d", "fetch-event"]);
        if !uses.fetch {
            cmd.args(["-d", "http"]);
        }
    }
    Ok((cmd, format!("{version} {node_version}")))
}

/// Writes [`JS_BUILD_WIT`] for a build on contract 0.2.0: the project's
/// `wit/v0.2/plugin.wit` (the contract `sluice` carries when the project
/// has none) and the world of what its modules import.
fn js_build_wit(
    project: &Project,
    uses: &crate::js::Uses,
    world: World,
) -> Result<(), AuthorError> {
    let dir = project.dir.join(JS_BUILD_WIT);
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let own = project.dir.join(crate::files::WIT_V0_2.0);
    let contract = match std::fs::read_to_string(&own) {
        Ok(text) => text,
        Err(_) => crate::files::WIT_V0_2.1.to_owned(),
    };
    for (name, text) in [
        ("plugin.wit", contract),
        ("world.wit", uses.world_wit(world)?),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    }
    Ok(())
}

/// `node_modules/.bin/componentize-js` in `dir` or the nearest ancestor
/// that has one, as Node itself resolves packages.
fn find_componentize_js(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .map(|d| d.join("node_modules/@bytecodealliance/componentize-js/src/cli.js"))
        .find(|p| p.is_file())
}

/// `cargo build --release --target wasm32-wasip2` in the project; the
/// component is the `.wasm` cargo reports.
fn build_rust(project: &Project) -> Result<BuildReport, AuthorError> {
    let cargo = crate::toolchain::cargo()?;
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&project.dir)
        .args(["build", "--release", "--target", RUST_TARGET])
        .arg("--message-format=json-render-diagnostics");
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let mut messages = String::new();
    run(&mut cmd, Some(&mut messages))?;
    let (wasm, fresh) = messages
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .flat_map(|m| {
            let fresh = m["fresh"] == true;
            m["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .map(|p| (p, fresh))
                .collect::<Vec<_>>()
        })
        .rfind(|(p, _)| p.extension().is_some_and(|e| e == "wasm"))
        .ok_or_else(|| AuthorError::BuildFailed {
            command: shown(&cmd),
            status: "it built no .wasm".into(),
            hint: Some(
                "the package must be a library with `crate-type = [\"cdylib\"]` under [lib]".into(),
            ),
        })?;
    Ok(BuildReport {
        wasm,
        rebuilt: !fresh,
    })
}

/// Runs `cmd` with stdin closed and its stderr on ours; its stdout goes to
/// `capture` when given, else to our stderr.
fn run(cmd: &mut Command, capture: Option<&mut String>) -> Result<(), AuthorError> {
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
    if capture.is_some() {
        cmd.stdout(Stdio::piped());
    } else {
        cmd.stdout(std::io::stderr());
    }
    let command = shown(cmd);
    let mut child = cmd.spawn().map_err(io(format!("running `{command}`")))?;
    if let (Some(buf), Some(mut stdout)) = (capture, child.stdout.take()) {
        stdout
            .read_to_string(buf)
            .map_err(io(format!("reading the output of `{command}`")))?;
    }
    let status = child.wait().map_err(io(format!("running `{command}`")))?;
    if status.success() {
        Ok(())
    } else {
        Err(AuthorError::BuildFailed {
            command,
            status: status.to_string(),
            hint: None,
        })
    }
}

/// A command line as a user could type it.
fn shown(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Like [`tool_version`], but a failure says why: the last lines of the
/// tool's stderr (Node's "Cannot find package …" is the useful one).
fn probe_version(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let useful: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("Error") || l.contains("error"))
        .take(2)
        .collect();
    Err(if useful.is_empty() {
        format!("it exited with {}", out.status)
    } else {
        useful.join("; ")
    })
}

fn missing(tool: &str, install: &str) -> AuthorError {
    AuthorError::ToolMissing {
        tool: tool.to_owned(),
        install: install.to_owned(),
    }
}

/// Says so on stderr when a tool is not the release the SDK was tested with.
fn warn_version(tool: &str, found: &str, pinned: &str, install: &str) {
    if !found.contains(pinned) {
        eprintln!(
            "warning: {tool} {found} found; Sluice's SDK is tested with {pinned} (`{install}`)"
        );
    }
}

/// A hash of the project's sources and `extra`.
fn inputs_hash(dir: &Path, extra: &[&str]) -> Result<String, AuthorError> {
    let files = sources(dir)?;
    let mut hasher = blake3::Hasher::new();
    for e in extra {
        hasher.update(e.as_bytes()).update(b"\0");
    }
    for (rel, path) in files {
        let bytes = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        hasher
            .update(rel.as_bytes())
            .update(b"\0")
            .update(&(bytes.len() as u64).to_le_bytes())
            .update(&bytes);
    }
    Ok(hasher.finalize().to_hex().to_string())
}

/// The project's source files, as (path relative to `dir` with `/`
/// separators, path), sorted.
fn sources(dir: &Path) -> Result<Vec<(String, PathBuf)>, AuthorError> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    files.sort();
    Ok(files)
}

/// The project's source files under `dir`, as (relative path, path).
fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), AuthorError> {
    let entries = std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || ["target", "node_modules", "__pycache__"].contains(&&*name) {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: a linked SDK is a source too.
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if path.is_file() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push((rel.to_string_lossy().replace('\\', "/"), path));
        }
    }
    Ok(())
}
