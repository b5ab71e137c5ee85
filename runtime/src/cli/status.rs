//! `sluice status`: one line per stage of the running daemon: throughput,
//! backlog, the age of its oldest unsettled message, in-flight work and
//! dead letters. The first place to look when a pipeline is slow or stuck.

use std::process::ExitCode;

use super::client::{AdminArgs, Client, ClientError};
use super::table;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print the daemon's JSON (one object per stage) instead of a table.
    #[arg(long)]
    json: bool,
    /// Not used: status always asks a running daemon, whose sampler the rates come from
    /// (on NATS, any daemon of the cluster). Accepted so that `--broker nats://...` gets
    /// that answer; SLUICE_BROKER is ignored here.
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    #[command(flatten)]
    admin: AdminArgs,
}

pub(crate) fn run(args: Args) -> ExitCode {
    match status(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}

fn status(args: &Args) -> Result<(), ClientError> {
    // The URL may carry credentials; it is not echoed.
    if args
        .broker
        .as_deref()
        .is_some_and(|b| b.trim() != "embedded")
    {
        return Err(ClientError::Usage(
            "status needs a running daemon, whichever broker it runs on (the rates are sampled there); drop --broker and point --admin at a daemon".into(),
        ));
    }
    let stages = Client::daemon(&args.admin)?.status()?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &stages)
            .map_err(std::io::Error::from)
            .and_then(|()| std::io::Write::write_all(&mut out, b"\n"))
    } else {
        let rows: Vec<Vec<String>> = stages
            .iter()
            .map(|s| {
                vec![
                    format!("{}/{}", s.pipeline, s.stage),
                    format!("{:.1}", s.processed_per_sec),
                    s.depth.to_string(),
                    table::age(s.oldest_age_seconds),
                    s.in_flight.to_string(),
                    s.dlq_depth.to_string(),
                ]
            })
            .collect();
        table::print(
            &mut out,
            &[
                "PIPELINE/STAGE",
                "RATE(/s)",
                "DEPTH",
                "OLDEST",
                "IN-FLIGHT",
                "DLQ",
            ],
            &rows,
        )
    };
    written.map_err(|e| ClientError::Failed(format!("cannot write output: {e}")))
}
