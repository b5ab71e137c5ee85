//! Checks of the server-install files in `deploy/` that need outside
//! tools: the Prometheus rules against `promtool` (syntax, and their unit
//! tests in `alerts.test.yaml`), and the systemd unit against
//! `systemd-analyze verify`, which must print nothing. The dashboard and
//! the rules' metric names are checked against a running daemon by
//! `tests/tests/server_install.rs`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Where the unit expects the binary; the check points it at `binary`.
const INSTALLED_BINARY: &str = "/usr/local/bin/sluice";

/// Installs the checks' tools when they are missing: `promtool` (Debian's
/// `prometheus` package) and `systemd-analyze` (Debian's `systemd`, which
/// installs in a container without an init too: `verify` needs no running
/// systemd).
pub(crate) fn ensure_tools() -> anyhow::Result<()> {
    let runs = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing: Vec<&str> = [("promtool", "prometheus"), ("systemd-analyze", "systemd")]
        .into_iter()
        .filter(|(tool, _)| !runs(tool))
        .map(|(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    super::apt_install(
        &missing,
        "the files in deploy/ are checked with promtool (the alerting rules) \
         and systemd-analyze (the unit)",
    )
}

/// Runs both checks; `binary` is the freshly built `sluice`.
pub(crate) fn check(binary: &Path) -> anyhow::Result<()> {
    let deploy = sluice_harness::repo_root().join("deploy");
    let rules = deploy.join("prometheus");
    super::run(
        Command::new("promtool")
            .args(["check", "rules", "alerts.yaml"])
            .current_dir(&rules),
    )?;
    super::run(
        Command::new("promtool")
            .args(["test", "rules", "alerts.test.yaml"])
            .current_dir(&rules),
    )?;
    verify_unit(&deploy.join("systemd").join("sluice.service"), binary)
}

/// `systemd-analyze verify` of a copy of `unit` whose commands run
/// `binary`: it must exit 0 and print nothing (it only warns about an
/// unknown or misspelt setting).
fn verify_unit(unit: &Path, binary: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(unit).with_context(|| format!("reading {}", unit.display()))?;
    let binary = binary.to_str().context("non-UTF-8 binary path")?;
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let copy = dir.path().join("sluice.service");
    std::fs::write(&copy, text.replace(INSTALLED_BINARY, binary))
        .context("writing the unit's copy")?;
    let out = match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "systemd-analyze not found: `cargo xtask setup` installs it (Debian: \
                 `apt-get install systemd`)"
            );
        }
        Err(err) => return Err(err).context("running systemd-analyze verify"),
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !said.trim().is_empty() {
        bail!(
            "systemd-analyze verify {} ({}):\n{said}",
            unit.display(),
            out.status
        );
    }
    println!("   systemd-analyze verify deploy/systemd/sluice.service: clean");
    Ok(())
}
