//! Jobs of `cargo xtask test` that run beside the main test run.
//!
//! CI has 2 cores and the end-to-end tests spend most of their time waiting
//! on servers. Two costs fit in that waiting: the SQS round trip (12 of a
//! cold run's minutes, bound by moto serving about 20 calls a second), and
//! the builds of the fuzz targets and the Rust SDK (a second full compile
//! of the runtime, instrumented). The builds run at the lowest CPU priority
//! (`nice -n 19`), so they take only what the tests leave; no job shares a
//! target directory with another, so none waits on cargo's lock.
//!
//! Each job writes to a log file; [`Job::finish`] waits for it and prints
//! the log, so CI's output still says what each job did.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command};

use anyhow::{Context, bail};

/// A command running in the background with its output in a file.
pub struct Job {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Job {
    /// Starts `cmd`, its stdout and stderr into `log`.
    pub fn start(name: &str, mut cmd: Command, log: PathBuf) -> anyhow::Result<Job> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        println!(
            "== started in the background: {name} (output: {})",
            log.display()
        );
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(Job {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// Waits for the job and prints its output; an error if it failed.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let status = self
            .child
            .wait()
            .with_context(|| format!("cannot wait for {}", self.name))?;
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        println!("== {} (ran in the background): {status}", self.name);
        println!("{text}");
        if !status.success() {
            bail!("{} failed ({status}); its output is above", self.name);
        }
        Ok(())
    }
}

impl Drop for Job {
    /// A job left behind by an earlier failure is stopped, not orphaned.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The path of the built test binary of `tests/tests/<name>.rs` (built by
/// `cargo test --no-run` with `extra`, which this asks again, quickly).
pub fn test_binary(name: &str, extra: &[&str]) -> anyhow::Result<PathBuf> {
    let out = super::cargo()
        .args([
            "test",
            "--package",
            "sluice-tests",
            "--test",
            name,
            "--no-run",
        ])
        .args(extra.iter().take_while(|a| **a != "--"))
        .args(["--message-format", "json", "--quiet"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot ask cargo for the test binary `{name}`"))?;
    if !out.status.success() {
        bail!("cargo could not build the test binary `{name}`");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|m| m["target"]["name"] == name && m["executable"].is_string())
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo named no executable for the test binary `{name}`"))
}

/// `cmd` at the lowest CPU priority (`nice -n 19`), with its environment and
/// directory.
pub fn niced(cmd: &Command) -> Command {
    let mut niced = Command::new("nice");
    niced
        .args(["-n", "19"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => niced.env(key, value),
            None => niced.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        niced.current_dir(dir);
    }
    niced
}
