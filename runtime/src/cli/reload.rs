//! `sluice reload`: the running daemon reads its pipeline files and plugins
//! again and applies what changed, or refuses and keeps running as it was.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use super::client::{AdminArgs, Client, ClientError};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Apply what a reload refuses by default: removing a topic that still holds messages.
    /// The daemon stops serving it; its messages stay in the broker.
    #[arg(long)]
    force: bool,
    /// Print the daemon's JSON report instead of text.
    #[arg(long)]
    json: bool,
    /// How long to wait for the daemon's answer. A reload compiles changed plugins and drains
    /// restarted stages (each within its pipeline's shutdown_timeout) before it answers.
    #[arg(long, value_name = "DURATION", value_parser = super::args::duration, default_value = "5m")]
    timeout: Duration,
    #[command(flatten)]
    admin: AdminArgs,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let report = match Client::daemon(&args.admin).and_then(|c| c.reload(args.force, args.timeout))
    {
        Ok(report) => report,
        Err(err) => return err.report(),
    };
    let printed = if args.json {
        serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::from)
            .and_then(|text| writeln!(std::io::stdout().lock(), "{text}"))
    } else {
        print(&report)
    };
    if let Err(err) = printed {
        return ClientError::Failed(format!("cannot write output: {err}")).report();
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

/// The report for people: what changed on stdout; warnings and errors on
/// stderr.
fn print(report: &crate::reload::ReloadReport) -> std::io::Result<()> {
    let mut err = std::io::stderr().lock();
    if !report.ok {
        for error in &report.errors {
            writeln!(err, "error: {error}")?;
        }
        writeln!(
            err,
            "reload refused ({} problem{}); the daemon runs its previous configuration",
            report.errors.len(),
            if report.errors.len() == 1 { "" } else { "s" }
        )?;
        return Ok(());
    }
    for warning in &report.warnings {
        writeln!(err, "warning: {warning}")?;
    }
    writeln!(
        std::io::stdout().lock(),
        "reloaded in {} ms (configuration {}): {}",
        report.took_ms,
        report.version,
        report.changes.summary()
    )
}
