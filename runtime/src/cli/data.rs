//! `sluice data check | salvage | quarantine`: the embedded broker's data
//! directory, inspected and repaired while no daemon runs. The work is in
//! [`crate::broker::embedded::tools`]; this file parses and prints.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::broker::embedded::tools::{self, ToolError};

/// The data subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Verify a stopped data directory: the journal and every table.
    ///
    /// Reports what is damaged and which topics, seq ranges and consumers it touches.
    /// Changes nothing (fjall opens a scratch copy). Exits 0 when clean, 1 when damaged,
    /// 2 when it cannot check (a daemon holds the directory, no store there).
    ///
    /// Example: sluice data check --data-dir /var/lib/sluice
    Check(DirArgs),
    /// Copy everything readable of a stopped data directory into a new one.
    ///
    /// The new directory is a fresh store a daemon can open (`--data-dir NEW`). Prints
    /// exactly what was lost (topics and seq ranges, consumers whose progress was lost),
    /// also written to NEW/salvage-report.txt. Never changes the old directory. Exits 0
    /// when nothing was lost, 1 when something was, 2 when it cannot run.
    ///
    /// Example: sluice data salvage --data-dir /var/lib/sluice --to /var/lib/sluice-salvaged
    Salvage(SalvageArgs),
    /// Remove a damaged seq range of a topic from a stopped data directory.
    ///
    /// For a table block `sluice data check` reports as unreadable, which stalls the stage
    /// that reads it. Rebuilds the store without messages FROM..=TO of the topic (and
    /// their pending entries), keeps the old store as store.quarantined-<ms> beside it and
    /// appends what was removed to quarantine-report.txt. Refuses a damaged journal (use
    /// salvage). Exits 0 when done, 2 when it cannot run.
    ///
    /// Example: sluice data quarantine --data-dir /var/lib/sluice --topic orders --from 8941 --to 9020
    Quarantine(QuarantineArgs),
}

/// A data directory.
#[derive(Debug, clap::Args)]
pub(crate) struct DirArgs {
    /// The data directory (`sluice run --data-dir`).
    #[arg(long, env = "SLUICE_DATA_DIR", value_name = "DIR")]
    data_dir: PathBuf,
}

/// Salvage's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct SalvageArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// The new data directory (must not exist, or be empty).
    #[arg(long, value_name = "NEW")]
    to: PathBuf,
}

/// Quarantine's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct QuarantineArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// The topic.
    #[arg(long)]
    topic: String,
    /// First seq to remove.
    #[arg(long, value_name = "SEQ")]
    from: u64,
    /// Last seq to remove.
    #[arg(long, value_name = "SEQ")]
    to: u64,
}

/// Runs a data subcommand.
pub(crate) fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Check(args) => tools::check(&args.data_dir).map(|report| {
            print!("{report}");
            exit(report.is_clean())
        }),
        Command::Salvage(args) => tools::salvage(&args.dir.data_dir, &args.to).map(|report| {
            print!("{report}");
            if report.is_clean() {
                println!("salvaged into {}: nothing lost", args.to.display());
            } else {
                println!(
                    "salvaged into {}: what is listed as DAMAGED above was lost",
                    args.to.display()
                );
            }
            exit(report.is_clean())
        }),
        Command::Quarantine(args) => {
            if args.from > args.to {
                eprintln!("error: --from {} is after --to {}", args.from, args.to);
                return ExitCode::from(2);
            }
            tools::quarantine(&args.dir.data_dir, &args.topic, args.from, args.to).map(|done| {
                println!("{done}");
                ExitCode::SUCCESS
            })
        }
    };
    result.unwrap_or_else(|err: ToolError| {
        eprintln!("error: {err}");
        ExitCode::from(2)
    })
}

/// 0 when clean, 1 otherwise.
fn exit(clean: bool) -> ExitCode {
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
