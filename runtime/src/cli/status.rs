//! `sluice status`: one line per stage of the running daemon (a sink is a
//! stage, marked `(sink)`, with `DOWN` while its target is unreachable; a
//! stage the operator paused is marked `PAUSED`):
//! throughput, backlog, the age of its oldest unsettled message, in-flight
//! work and dead letters; then one line per source: what it has read, the
//! upstream's lag, and whether it reaches its upstream. The first place to
//! look when a pipeline is slow or stuck.

use std::io::Write;
use std::process::ExitCode;

use super::client::{AdminArgs, Client, ClientError};
use super::table;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print the daemon's JSON (one object per stage; with --sources, one per source)
    /// instead of tables.
    #[arg(long)]
    json: bool,
    /// With --json: print the sources instead of the stages.
    #[arg(long, requires = "json")]
    sources: bool,

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
    let client = Client::daemon(&args.admin)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let written = if args.sources {
            serde_json::to_writer_pretty(&mut out, &client.sources()?)
        } else {
            serde_json::to_writer_pretty(&mut out, &client.status()?)
        };
        return written
            .map_err(std::io::Error::from)
            .and_then(|()| std::io::Write::write_all(&mut out, b"\n"))
            .map_err(|e| ClientError::Failed(format!("cannot write output: {e}")));
    }
    let stages = client.status()?;
    let sources = client.sources()?;
    let reloads = client.reload_summary()?;
    let written = {
        let rows: Vec<Vec<String>> = stages
            .iter()
            .flat_map(|s| {
                let mut marks = Vec::new();
                if let Some(kind) = s.kind.strip_prefix("sink:") {
                    marks.push(format!("sink:{kind}"));
                    if s.up == Some(false) {
                        marks.push("DOWN".into());
                    }
                }
                if s.paused {
                    marks.push("PAUSED".into());
                }
                if let Some(rate) = &s.rate {
                    marks.push(format!("rate {rate}"));
                }
                if let (Some(limit), Some(max)) = (s.concurrency_limit, s.concurrency_max) {
                    marks.push(format!("limit {limit}/{max}"));
                }
                if s.held_until.is_some() {
                    marks.push("HELD (Retry-After)".into());
                }
                let name = if marks.is_empty() {
                    format!("{}/{}", s.pipeline, s.stage)
                } else {
                    format!("{}/{} ({})", s.pipeline, s.stage, marks.join(", "))
                };
                let stage = vec![
                    name,
                    format!("{:.1}", s.processed_per_sec),
                    s.depth.to_string(),
                    table::age(s.oldest_age_seconds),
                    s.in_flight.to_string(),
                    delayed_text(s.delayed, s.next_due.as_deref()),
                    s.dlq_depth.to_string(),
                ];
                // A stage with priority lanes: a row per lane under it.
                std::iter::once(stage).chain(s.lanes.iter().map(|lane| {
                    vec![
                        format!("  > {}{}", lane.topic, wait_text(lane)),
                        String::new(),
                        lane.depth.to_string(),
                        table::age(lane.oldest_age_seconds),
                        lane.in_flight.to_string(),
                        String::new(),
                        String::new(),
                    ]
                }))
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
                "DELAYED",
                "DLQ",
            ],
            &rows,
        )
        .and_then(|()| {
            if sources.is_empty() {
                return Ok(());
            }
            let rows: Vec<Vec<String>> = sources
                .iter()
                .map(|s| {
                    vec![
                        format!("{}/{} ({})", s.pipeline, s.source, s.kind),
                        s.topic.clone(),
                        s.read_total.to_string(),
                        lag_text(s.lag, &s.partition_lag),
                        if s.up { "up" } else { "DOWN" }.to_owned(),
                        s.dlq_depth.to_string(),
                    ]
                })
                .collect();
            std::io::Write::write_all(&mut out, b"\n")?;
            table::print(
                &mut out,
                &["PIPELINE/SOURCE", "TO", "READ", "LAG", "UPSTREAM", "DLQ"],
                &rows,
            )
        })
        .and_then(|()| match reloads.as_ref().and_then(reload_text) {
            Some(line) => writeln!(out, "\n{line}"),
            None => Ok(()),
        })
    };
    written.map_err(|e| ClientError::Failed(format!("cannot write output: {e}")))
}

/// The reload line under the tables, once the daemon has reloaded:
/// `reloads: 3 applied, 1 refused; last refused at T (SIGHUP): first error`.
fn reload_text(summary: &crate::reload::ReloadSummary) -> Option<String> {
    let last = summary.last.as_ref()?;
    let what = if last.ok {
        format!("applied at {} ({})", last.at, last.trigger)
    } else {
        format!(
            "REFUSED at {} ({}): {}",
            last.at,
            last.trigger,
            last.errors
                .first()
                .map(ToString::to_string)
                .unwrap_or_default()
        )
    };
    Some(format!(
        "reloads: {} applied, {} refused; last {what}",
        summary.succeeded, summary.failed
    ))
}

/// A source's lag for the table: the total, then per partition where the
/// upstream has them (`120 (0:30 1:90)`; the first 16).
fn lag_text(total: Option<u64>, partitions: &[(String, u64)]) -> String {
    let Some(total) = total else {
        return "-".to_owned();
    };
    if partitions.is_empty() {
        return total.to_string();
    }
    let mut parts: Vec<String> = partitions
        .iter()
        .take(16)
        .map(|(p, lag)| format!("{p}:{lag}"))
        .collect();
    if partitions.len() > 16 {
        parts.push("...".to_owned());
    }
    format!("{total} ({})", parts.join(" "))
}

/// A lane's recent wait for a slot, after its topic: ` (wait p50 3ms, p99 41ms)`.
fn wait_text(lane: &crate::admin::LaneStatus) -> String {
    let (Some(p50), Some(p99)) = (lane.wait_p50_seconds, lane.wait_p99_seconds) else {
        return String::new();
    };
    let show = |seconds: f64| {
        humantime::format_duration(std::time::Duration::from_millis((seconds * 1000.0) as u64))
            .to_string()
    };
    format!(" (wait p50 {}, p99 {})", show(p50), show(p99))
}

/// The DELAYED column: how many wait on the stage's topic, and how soon
/// the next is due where the broker says (`12 (next in 4m 10s)`).
fn delayed_text(delayed: u64, next_due: Option<&str>) -> String {
    if delayed == 0 {
        return "0".into();
    }
    let next = next_due
        .and_then(|at| crate::timestamp::parse_rfc3339_millis(at).ok())
        .map(|due| {
            let left = due.saturating_sub(crate::broker::now_millis()) / 1000;
            format!(
                " (next in {})",
                humantime::format_duration(std::time::Duration::from_secs(left))
            )
        });
    format!("{delayed}{}", next.unwrap_or_default())
}
