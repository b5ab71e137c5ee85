//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the fuzz targets in
//! `fuzz/` under libFuzzer, through `cargo fuzz` on the stable toolchain
//! (`--sanitizer none`: Rust code needs no address sanitizer to fail
//! loudly, and the sanitizers need nightly).
//!
//! Each target starts from its seeds in `fuzz/corpus/<target>` (kept in the
//! repository, read only here) and writes what it finds to a scratch corpus
//! under the target directory, so a run never changes the checkout. A
//! crash, a hang past ten seconds or 2 GiB of RSS fails the run and leaves
//! the input in `<target>/fuzz/artifacts/<target>/`; replay it with
//! `cargo fuzz run --sanitizer none --dev TARGET FILE` in `fuzz/`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// The version `cargo xtask fuzz` installs when `cargo fuzz` is missing.
const CARGO_FUZZ: &str = "0.13.2";

/// Every target, as named in `fuzz/Cargo.toml`.
pub const TARGETS: &[&str] = &[
    "pipeline_file",
    "cases_file",
    "ingest_batch",
    "journal",
    "store_record",
];

const USAGE: &str = "\
usage: cargo xtask fuzz [--seconds N] [TARGET...]

Runs each fuzz target (default: all) for N seconds (default 30) from its
seeds in fuzz/corpus/TARGET. Targets: pipeline_file, cases_file,
ingest_batch, journal, store_record.";

/// Runs the targets named in `args` (all by default).
pub fn fuzz(args: &[&str]) -> anyhow::Result<()> {
    let mut seconds: u64 = 30;
    let mut targets = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match *arg {
            "--seconds" => {
                let value = rest.next().context("--seconds needs a number")?;
                seconds = value
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .with_context(|| format!("--seconds {value}: not a positive number"))?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            name if TARGETS.contains(&name) => targets.push(name),
            other => bail!("unknown fuzz target or flag `{other}`\n\n{USAGE}"),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    ensure_cargo_fuzz()?;
    let root = sluice_harness::repo_root();
    let fuzz_dir = root.join("fuzz");
    // Instrumented artifacts must not mix with the workspace's own.
    let target_dir = super::target_dir().join("fuzz");
    println!("== cargo fuzz build (instrumented, dev profile)");
    super::run(cargo_fuzz(&fuzz_dir, &target_dir).args(["build", "--sanitizer", "none", "--dev"]))?;
    for target in targets {
        println!("== fuzz {target} for {seconds} s");
        let scratch = target_dir.join("corpus").join(target);
        let artifacts = target_dir.join("artifacts").join(target);
        for dir in [&scratch, &artifacts] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let seeds = fuzz_dir.join("corpus").join(target);
        let result = super::run(
            cargo_fuzz(&fuzz_dir, &target_dir)
                .args(["run", "--sanitizer", "none", "--dev", target])
                .arg(&scratch)
                .arg(&seeds)
                .arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg("-timeout=10")
                .arg("-rss_limit_mb=2048")
                .arg("-print_final_stats=1")
                .arg(format!("-artifact_prefix={}/", artifacts.display())),
        );
        if let Err(e) = result {
            bail!(
                "{e}\nthe failing input is in {}; replay it with \
                 `cargo fuzz run --sanitizer none --dev {target} FILE` in fuzz/",
                artifacts.display()
            );
        }
    }
    Ok(())
}

fn cargo_fuzz(fuzz_dir: &Path, target_dir: &Path) -> Command {
    let mut cmd = super::cargo();
    cmd.arg("fuzz")
        .current_dir(fuzz_dir)
        .env("CARGO_TARGET_DIR", target_dir);
    cmd
}

/// Installs cargo-fuzz (from crates.io, pinned) when `cargo fuzz` is
/// missing.
fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let present = super::cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    println!("== cargo install cargo-fuzz {CARGO_FUZZ}");
    // A target directory of its own: installing must not wait on, or
    // rebuild in, the workspace's.
    super::run(
        super::cargo()
            .args(["install", "--locked", "--version", CARGO_FUZZ, "cargo-fuzz"])
            .env(
                "CARGO_TARGET_DIR",
                super::target_dir().join("cargo-install"),
            ),
    )
}
