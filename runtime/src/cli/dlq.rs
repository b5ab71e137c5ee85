//! `sluice dlq list|show|redrive|purge <PIPELINE>/<STAGE>`: look into a
//! stage's dead-letter topic and act on it, through the running daemon or
//! straight on NATS.

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;

use super::client::{Client, ClientError, ConnectArgs};
use super::table;
use crate::admin::{DlqEntry, DlqFilter, PurgeRequest, RedriveRequest};
use crate::broker::now_millis;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List a stage's dead-lettered messages, oldest first.
    ///
    /// One line per entry: its SEQ (what `show` takes), message id, failure kind (retry,
    /// rejected, trap, timeout, out-of-memory, output-too-large, undeclared-topic,
    /// claim-missing, publish-failed), attempts, how long ago it last failed, the W3C trace
    /// id (a TRACE column, when any entry has a `traceparent`), and the error.
    ///
    /// The filters (--kind, --since, --until, --error, --header, --key, --seq) narrow the list; every
    /// one given must match.
    ///
    /// Example: sluice dlq list orders/route --limit 20
    ///
    /// Example: sluice dlq list orders/route --kind timeout --since 1h
    List(ListArgs),
    /// Print one dead-lettered message in full, as JSON: provenance, trace id (`trace_id`, from
    /// its W3C `traceparent`), headers and payload.
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
    /// --dry-run first to see what would happen (the count and the first ten), and --rate to
    /// spare a struggling dependency. The filters take part of the DLQ: only the entries that
    /// match every one given are redriven; the rest stay.
    ///
    /// Example: sluice dlq redrive orders/route --rate 50 --dry-run
    ///
    /// Example: sluice dlq redrive orders/route --kind unavailable --since 2026-11-26T09:00:00Z
    ///
    /// With --from-archive URL, the entries a purge archived (`dlq: {archive}`) are read from
    /// the archive by this command, with your credentials, and redriven the same way.
    ///
    /// Example: sluice dlq redrive --from-archive s3://lake/dlq/orders/route --dry-run
    Redrive(RedriveArgs),
    /// Delete dead-lettered messages for good (with `dlq: {archive}`, written to the archive
    /// first: a store that does not take them deletes nothing).
    ///
    /// Say how many: --limit N deletes the oldest N, --all deletes every entry of the stage, or
    /// with filters every entry that matches them. --dry-run counts and shows the first ten.
    ///
    /// Example: sluice dlq purge orders/route --limit 100
    ///
    /// Example: sluice dlq purge orders/route --all --kind rejected --until 7d --dry-run
    Purge(PurgeArgs),
}

/// `<PIPELINE>/<STAGE>`.
#[derive(Debug, Clone)]
pub(crate) struct StageRef {
    pub pipeline: String,
    pub stage: String,
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

pub(crate) fn stage_ref(text: &str) -> Result<StageRef, String> {
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

/// The entries to take. Every filter given must match; none takes all.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct FilterArgs {
    /// Only entries whose last failure was of this kind (retry, rejected, trap, timeout,
    /// out-of-memory, output-too-large, undeclared-topic, claim-missing, publish-failed,
    /// dedup-conflict, unavailable). Repeat it, or separate kinds with commas, for any of
    /// several.
    #[arg(long, value_name = "KIND")]
    kind: Vec<String>,
    /// Only entries dead-lettered at or after TIME: RFC 3339 (2026-11-26T09:00:00Z) or a
    /// duration back from now (90s, 1h, 2days).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only entries dead-lettered at or before TIME, in the same forms as --since.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// Only entries whose error contains TEXT (case-sensitive).
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Only entries with this header and value. Repeat it for several (all must match).
    #[arg(long, value_name = "NAME=VALUE")]
    header: Vec<String>,
    /// Only entries with this message key.
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// Only the entry with this sequence (the SEQ column of `dlq list`);
    /// repeat for several.
    #[arg(long, value_name = "SEQ")]
    seq: Vec<u64>,
}

impl FilterArgs {
    fn filter(&self) -> DlqFilter {
        DlqFilter {
            kind: self.kind.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            error: self.error.clone(),
            header: self.header.clone(),
            key: self.key.clone(),
            seq: self.seq.clone(),
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// The stage, as PIPELINE/STAGE.
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
    stage: StageRef,
    /// Show at most N entries (1 to 1000; narrow with the filters for more).
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: u32,
    /// Print JSON (what the admin API answers) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    filter: FilterArgs,
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
    /// The stage, as PIPELINE/STAGE (optional with --from-archive: then every stage's
    /// archived entries).
    #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref,
          required_unless_present = "from_archive")]
    stage: Option<StageRef>,
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
    filter: FilterArgs,
    #[command(flatten)]
    archive: super::archive::ArchiveArgs,
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
    /// Delete every entry of the stage (that the filters take).
    #[arg(long)]
    all: bool,
    /// Count what would be deleted, and show the first ten, without deleting anything.
    #[arg(long)]
    dry_run: bool,
    /// Print the JSON report (what the admin API answers) instead of a summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    filter: FilterArgs,
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
    let filter = args.filter.filter();
    let list = client.dlq_list(&args.stage.pipeline, &args.stage.stage, args.limit, &filter)?;
    if args.json {
        return print_json(&list);
    }
    if list.entries.is_empty() {
        let what = if filter.is_empty() {
            "is empty"
        } else {
            "has no entry that matches"
        };
        return print_line(&format!(
            "the DLQ of {} ({}) {what}",
            args.stage, list.topic
        ));
    }
    let mut out = std::io::stdout().lock();
    print_entries(&mut out, &list.entries)?;
    let shown = list.entries.len() as u64;
    if shown == u64::from(args.limit) {
        writeln!(
            out,
            "({shown} shown of {} entries in {}; --limit shows more)",
            list.depth, list.topic
        )
        .map_err(write_error)?;
    }
    Ok(())
}

/// Entries as a table, one line each; with a TRACE column (the W3C trace
/// id) when any entry has one, so untraced pipelines keep a narrow table.
fn print_entries(out: &mut impl Write, entries: &[DlqEntry]) -> Result<(), ClientError> {
    let now = now_millis();
    let traced = entries.iter().any(|e| e.trace_id.is_some());
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let mut row = vec![
                e.seq.to_string(),
                e.id.clone(),
                e.kind.clone().unwrap_or_else(|| "-".into()),
                e.attempts.map_or_else(|| "-".into(), |n| n.to_string()),
                e.last_failure.map_or_else(
                    || "-".into(),
                    |at| table::age(Some(now.saturating_sub(at) as f64 / 1000.0)) + " ago",
                ),
            ];
            if traced {
                row.push(e.trace_id.clone().unwrap_or_else(|| "-".into()));
            }
            row.push(table::one_line(
                e.error.as_deref().or(e.problem.as_deref()).unwrap_or("-"),
                100,
            ));
            row
        })
        .collect();
    let mut titles = vec!["SEQ", "ID", "KIND", "ATTEMPTS", "LAST FAILURE"];
    if traced {
        titles.push("TRACE");
    }
    titles.push("ERROR");
    table::print(out, &titles, &rows).map_err(write_error)
}

/// A dry run's first entries, and how many more there are.
fn print_sample(out: &mut impl Write, sample: &[DlqEntry], total: u64) -> Result<(), ClientError> {
    if sample.is_empty() {
        return Ok(());
    }
    print_entries(out, sample)?;
    let more = total.saturating_sub(sample.len() as u64);
    if more > 0 {
        writeln!(out, "(and {more} more)").map_err(write_error)?;
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
        let state = case_state(&client, &args.stage, &entry);
        let yaml = super::cases::dlq_case_yaml(&stage, args.seq, &entry, &state);
        return print_line(yaml.trim_end());
    }
    print_json(&entry)
}

/// The values of the state keys `entry`'s last attempt read, as the store
/// holds them now: with the read token, none (the keys only).
fn case_state(
    client: &Client,
    stage: &StageRef,
    entry: &crate::admin::DlqEntryDetail,
) -> super::cases::CaseState {
    let (keys, more) = crate::dlq::state_read(&entry.headers);
    let mut state = super::cases::CaseState {
        more,
        ..Default::default()
    };
    for key in keys {
        if state.withheld.is_some() {
            state.values.push((key, None));
            continue;
        }
        let value = match client.state_get(&stage.pipeline, &stage.stage, &key) {
            Ok(found) => found.value,
            Err(ClientError::Api { status, message }) if status.as_u16() == 403 => {
                state.withheld = Some(message);
                None
            }
            Err(_) => None,
        };
        state.values.push((key, value));
    }
    state
}

fn redrive(args: &RedriveArgs) -> Result<(), ClientError> {
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        return Err(ClientError::Usage(format!(
            "--rate must be a positive number of messages per second, not {rate}"
        )));
    }
    if let Some(url) = &args.archive.from_archive {
        return redrive_archive(args, url);
    }
    let Some(stage) = &args.stage else {
        return Err(ClientError::Usage(
            "say which stage: PIPELINE/STAGE, or --from-archive URL".into(),
        ));
    };
    let client = Client::connect(&args.connect)?;
    let request = RedriveRequest {
        limit: args.limit,
        rate: args.rate,
        dry_run: args.dry_run,
        filter: args.filter.filter(),
    };
    let report = client.dlq_redrive(&stage.pipeline, &stage.stage, &request)?;
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
        stage
    )
    .map_err(write_error)?;
    if report.dry_run {
        print_sample(&mut out, &report.sample, report.redriven)?;
    } else {
        for id in &report.ids {
            writeln!(out, "  {id}").map_err(write_error)?;
        }
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

/// `redrive --from-archive`: the CLI reads the archive (see
/// `cli/archive.rs`), the daemon only takes entries, never a URL.
fn redrive_archive(args: &RedriveArgs, url: &str) -> Result<(), ClientError> {
    if !args.filter.filter().is_empty() || args.limit.is_some() {
        return Err(ClientError::Usage(
            "--from-archive redrives every archived entry (of PIPELINE/STAGE when given); the \
             filters and --limit are for a DLQ"
                .into(),
        ));
    }
    let entries = super::archive::read(&args.archive, url)?;
    let client = Client::connect(&args.connect)?;
    let only = args
        .stage
        .as_ref()
        .map(|s| (s.pipeline.as_str(), s.stage.as_str()));
    let report = super::archive::redrive(&client, entries, only, args.rate, args.dry_run)?;
    if args.json {
        return print_json(&report);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} message{} from the archive {url}",
        if report.dry_run {
            "would redrive"
        } else {
            "redrove"
        },
        report.redriven,
        plural(report.redriven),
    )
    .map_err(write_error)?;
    for id in &report.ids {
        writeln!(out, "  {id}").map_err(write_error)?;
    }
    if !report.skipped.is_empty() {
        writeln!(out, "skipped (left in the archive):").map_err(write_error)?;
        for why in &report.skipped {
            writeln!(out, "  {why}").map_err(write_error)?;
        }
    }
    Ok(())
}

fn purge(args: &PurgeArgs) -> Result<(), ClientError> {
    let client = Client::connect(&args.connect)?;
    let request = PurgeRequest {
        limit: args.limit,
        all: args.all,
        dry_run: args.dry_run,
        filter: args.filter.filter(),
    };
    let report = client.dlq_purge(&args.stage.pipeline, &args.stage.stage, &request)?;
    if args.connect.nats_without_pipelines() && !report.dry_run && report.purged > 0 {
        // Not an error (a stage without an archive purges as before), but
        // never silent: an archive this call cannot see is not written.
        // Said once the stage is known to exist, after an unknown stage's
        // error would have been the only line.
        eprintln!(
            "note: without --pipelines the stage's `dlq: {{archive}}`, if it has one, is not \
             known here, so the purged entries are not archived; pass the pipeline files to \
             archive them first"
        );
    }
    if args.json {
        return print_json(&report);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} entr{} from the DLQ of {}",
        if report.dry_run {
            "would purge"
        } else {
            "purged"
        },
        report.purged,
        if report.purged == 1 { "y" } else { "ies" },
        args.stage
    )
    .map_err(write_error)?;
    for object in &report.archived {
        writeln!(out, "  archived to {object}").map_err(write_error)?;
    }
    print_sample(&mut out, &report.sample, report.purged)
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
