//! `sluice stage pause|resume <PIPELINE>/<STAGE>`: the operator's hold on a
//! stage, through the running daemon or straight on NATS.

use std::io::Write;
use std::process::ExitCode;

use super::client::{Client, ClientError, ConnectArgs};
use super::dlq::{StageRef, stage_ref};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Stop a stage fetching: nothing new is delivered to its handler or sink.
    ///
    /// Calls in flight finish and settle, so nothing is lost or repeated. Messages wait in
    /// the topic (and count toward its high_water_mark, so producers meet backpressure
    /// rather than an unbounded queue). The pause is kept by the broker: it survives a
    /// daemon restart, and on NATS it holds for every daemon. `sluice status` shows it.
    ///
    /// Example: sluice stage pause orders/route
    Pause(Args),
    /// Let a paused stage fetch again.
    ///
    /// Example: sluice stage resume orders/route
    Resume(Args),
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The stage, as PIPELINE/STAGE.
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
    stage: StageRef,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub(crate) fn run(command: Command) -> ExitCode {
    let (args, paused) = match &command {
        Command::Pause(args) => (args, true),
        Command::Resume(args) => (args, false),
    };
    let result = Client::connect(&args.connect)
        .and_then(|client| client.stage_set_paused(&args.stage.pipeline, &args.stage.stage, paused))
        .and_then(|control| {
            writeln!(
                std::io::stdout().lock(),
                "{} {}",
                if control.paused { "paused" } else { "resumed" },
                args.stage
            )
            .map_err(|e| ClientError::Failed(format!("cannot write output: {e}")))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}
