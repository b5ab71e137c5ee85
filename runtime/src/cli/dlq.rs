//! `sluice dlq list|show|redrive|purge <PIPELINE>/<STAGE>`: look into a
//! stage's dead-letter topic and act on it, through the running daemon or
//! straight on NATS.

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;

use super::client::{Client, ClientError, ConnectArgs};
use super::table;
use crate::admin::{PurgeRequest, RedriveRequest};
use crate::broker::now_millis;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List a stage's dead-lettered messages, oldest first.
    ///
    /// One line per entry: its SEQ (what `show` takes), message id, failure kind (retry,
    /// rejected, trap, timeout, out-of-memory, output-too-large, undeclared-topic,
    /// claim-missing, publish-failed), attempts, how long ago it last failed, and the error.
    ///
    /// Example: sluice dlq list orders/route --limit 20
    List(ListArgs),
    /// Print one dead-lettered message in full, as JSON: provenance, headers and payload.
    ///
    /// With --as-case, print it as a handler test case instead (the message as the handler
    /// saw it, expecting success): a list item to append under `cases:` in a cases file, then
    /// fix the handler until `sluice plugin test . --cases cases.yaml` passes, then redrive.
    ///
    /// Example: sluice dlq show orders/route 42
    ///
    /// Example: sluice dlq show orders/route 42 --as-case >> cases.yaml
    Show(ShowArgs),
    /// Publish dead-lettered messages back to the topic they came from, for the stage that
    /// failed them to try again.
    ///
    /// Oldest first. Each message goes back to its source topic marked for this stage only (other
    /// stages on that topic do not see it again) and then leaves the DLQ. Entries without
    /// provenance cannot be routed and stay in the DLQ; they are listed as skipped. Use
    /// --dry-run first to see what would happen, and --rate to spare a struggling dependency.
    ///
    /// Example: sluice dlq redrive orders/route --rate 50 --dry-run
    Redrive(RedriveArgs),
    /// Delete dead-lettered messages for good.
    ///
    /// Say how many: --limit N deletes the oldest N, --all deletes every entry of the stage.
    ///
    /// Example: sluice dlq purge orders/route --limit 100
    Purge(PurgeArgs),
}

/// `<PIPELINE>/<STAGE>`.
#[derive(Debug, Clone)]
pub(crate) struct StageRef {
    pipeline: String,
    stage: String,
}

impl std::fmt::Display for StageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pipeline, self.stage)
    }
}

/// `<PIPELINE>/<STAGE>/<SEQ>`: one dead letter.
#[derive(Debug, Clone)]
pub(crate) struct EntryRef {
    /// The stage.
    pub stage: StageRef,
    /// The entry's sequence in the stage's DLQ.
    pub seq: u64,
}

pub(crate) fn entry_ref(text: &str) -> Result<EntryRef, String> {
    let bad = || format!("`{text}` is not PIPELINE/STAGE/SEQ (for example orders/route/42)");
    let (stage, seq) = text.rsplit_once('/').ok_or_else(bad)?;
    Ok(EntryRef {
        stage: stage_ref(stage).map_err(|_| bad())?,
        seq: seq.parse().map_err(|_| bad())?,
    })
}

impl EntryRef {
    /// The entry, fetched through the daemon or NATS.
    pub(crate) fn fetch(
        &self,
        connect: &ConnectArgs,
    ) -> Result<crate::admin::DlqEntryDetail, ClientError> {
        Client::connect(connect)?.dlq_show(&self.stage.pipeline, &self.stage.stage, self.seq)
    }
}

fn stage_ref(text: &str) -> Result<StageRef, String> {
    match text.split_once('/') {
        Some((pipeline, stage))
            if !pipeline.is_empty() && !stage.is_empty() && !stage.contains('/') =>
        {
            Ok(StageRef {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
            })
        }
        _ => Err(format!(
            "`{text}` is not PIPELINE/STAGE (for example orders/route)"
        )),
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// The stage, as PIPELINE/STAGE.
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
    stage: StageRef,
    /// Show at most N entries.
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u32,
    /// Print JSON (what the admin API answers) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
    /// The stage, as PIPELINE/STAGE.
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
    stage: StageRef,
    /// The entry's SEQ, as `dlq list` shows it.
    seq: u64,
    /// Print the entry as a test case for `sluice plugin test --cases` (YAML, a list item
    /// under `cases:`).
    #[arg(long)]
    as_case: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct RedriveArgs {
    /// The stage, as PIPELINE/STAGE.
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
    stage: StageRef,
    /// Redrive at most N entries (default: all).
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// At most N messages per second (default: as fast as the broker takes them).
    #[arg(long, value_name = "N")]
    rate: Option<f64>,
    /// Show what would be redriven without changing anything.
    #[arg(long)]
    dry_run: bool,
    /// Print the JSON report (what the admin API answers) instead of a summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("how_many").required(true).args(["limit", "all"])))]
pub(crate) struct PurgeArgs {
    /// The stage, as PIPELINE/STAGE.
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
    stage: StageRef,
    /// Delete the oldest N entries.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Delete every entry of the stage.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub(crate) fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::List(args) => list(&args),
        Command::Show(args) => show(&args),
        Command::Redrive(args) => redrive(&args),
        Command::Purge(args) => purge(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}

fn list(args: &ListArgs) -> Result<(), ClientError> {
    let client = Client::connect(&args.connect)?;
    let list = client.dlq_list(&args.stage.pipeline, &args.stage.stage, args.limit)?;
    if args.json {
        return print_json(&list);
    }
    if list.entries.is_empty() {
        return print_line(&format!(
            "the DLQ of {} ({}) is empty",
            args.stage, list.topic
        ));
    }
    let now = now_millis();
    let rows: Vec<Vec<String>> = list
        .entries
        .iter()
        .map(|e| {
            vec![
                e.seq.to_string(),
                e.id.clone(),
                e.kind.clone().unwrap_or_else(|| "-".into()),
                e.attempts.map_or_else(|| "-".into(), |n| n.to_string()),
                e.last_failure.map_or_else(
                    || "-".into(),
                    |at| table::age(Some(now.saturating_sub(at) as f64 / 1000.0)) + " ago",
                ),
                table::one_line(
                    e.error.as_deref().or(e.problem.as_deref()).unwrap_or("-"),
                    100,
                ),
            ]
        })
        .collect();
    let mut out = std::io::stdout().lock();
    table::print(
        &mut out,
        &["SEQ", "ID", "KIND", "ATTEMPTS", "LAST FAILURE", "ERROR"],
        &rows,
    )
    .map_err(write_error)?;
    let shown = list.entries.len() as u64;
    if list.depth > shown {
        writeln!(
            out,
            "({shown} of {} entries in {}; --limit shows more)",
            list.depth, list.topic
        )
        .map_err(write_error)?;
    }
    Ok(())
}

fn show(args: &ShowArgs) -> Result<(), ClientError> {
    let client = Client::connect(&args.connect)?;
    let entry = client.dlq_show(&args.stage.pipeline, &args.stage.stage, args.seq)?;
    if args.as_case {
        let stage = args.stage.to_string();
        if let Some(why) = super::cases::dlq_case_refusal(&stage, args.seq, &entry) {
            return Err(ClientError::Usage(why));
        }
        let yaml = super::cases::dlq_case_yaml(&stage, args.seq, &entry);
        return print_line(yaml.trim_end());
    }
    print_json(&entry)
}

fn redrive(args: &RedriveArgs) -> Result<(), ClientError> {
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        return Err(ClientError::Usage(format!(
            "--rate must be a positive number of messages per second, not {rate}"
        )));
    }
    let client = Client::connect(&args.connect)?;
    let request = RedriveRequest {
        limit: args.limit,
        rate: args.rate,
        dry_run: args.dry_run,
    };
    let report = client.dlq_redrive(&args.stage.pipeline, &args.stage.stage, &request)?;
    if args.json {
        return print_json(&report);
    }
    let mut out = std::io::stdout().lock();
    let verb = if report.dry_run {
        "would redrive"
    } else {
        "redrove"
    };
    writeln!(
        out,
        "{verb} {} message{} from the DLQ of {}",
        report.redriven,
        plural(report.redriven),
        args.stage
    )
    .map_err(write_error)?;
    for id in &report.ids {
        writeln!(out, "  {id}").map_err(write_error)?;
    }
    if report.skipped > 0 {
        writeln!(
            out,
            "skipped {} entr{} (left in the DLQ):",
            report.skipped,
            if report.skipped == 1 { "y" } else { "ies" }
        )
        .map_err(write_error)?;
        for skipped in &report.skipped_entries {
            writeln!(
                out,
                "  seq {} ({}): {}",
                skipped.seq, skipped.id, skipped.reason
            )
            .map_err(write_error)?;
        }
    }
    if report.time_limit_reached {
        writeln!(
            out,
            "the redrive reached its time limit; run it again to continue"
        )
        .map_err(write_error)?;
    }
    if report.interrupted {
        writeln!(
            out,
            "the daemon began shutting down; run the redrive again to continue"
        )
        .map_err(write_error)?;
    }
    Ok(())
}

fn purge(args: &PurgeArgs) -> Result<(), ClientError> {
    let client = Client::connect(&args.connect)?;
    let request = PurgeRequest {
        limit: args.limit,
        all: args.all,
    };
    let report = client.dlq_purge(&args.stage.pipeline, &args.stage.stage, &request)?;
    print_line(&format!(
        "purged {} entr{} from the DLQ of {}",
        report.purged,
        if report.purged == 1 { "y" } else { "ies" },
        args.stage
    ))
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn print_json(value: &impl Serialize) -> Result<(), ClientError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ClientError::Failed(format!("cannot encode the output: {e}")))?;
    print_line(&text)
}

fn print_line(text: &str) -> Result<(), ClientError> {
    writeln!(std::io::stdout().lock(), "{text}").map_err(write_error)
}

fn write_error(e: std::io::Error) -> ClientError {
    ClientError::Failed(format!("cannot write output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_refs() {
        let r = stage_ref("orders/route").expect("valid");
        assert_eq!(r.to_string(), "orders/route");
        assert_eq!((r.pipeline.as_str(), r.stage.as_str()), ("orders", "route"));
        for bad in ["orders", "/route", "orders/", "a/b/c"] {
            assert!(stage_ref(bad).is_err(), "{bad}");
        }
        let e = entry_ref("orders/route/42").expect("valid");
        assert_eq!(
            (e.stage.to_string(), e.seq),
            ("orders/route".to_owned(), 42)
        );
        for bad in ["orders/route", "orders/route/x", "orders/42", "a/b/c/1"] {
            assert!(entry_ref(bad).is_err(), "{bad}");
        }
    }
}
