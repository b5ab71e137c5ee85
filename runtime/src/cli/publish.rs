//! `sluice publish`: put one message on a topic, as a producer would,
//! through the running daemon's ingest API (`POST
//! /v1/topics/{topic}/messages`) or straight to NATS, and print what the
//! broker stored.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use super::args;
use super::client::{Client, ClientError, ConnectArgs, Outgoing};
use crate::admin::check_id;
use crate::delay;
use crate::timestamp::parse_rfc3339_millis;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The topic: one a loaded pipeline declares (or a stage's DLQ topic); with a NATS
    /// --broker and no --pipelines, any topic NATS has a stream for.
    topic: String,
    /// `-`: read the payload from stdin.
    #[arg(value_name = "-", value_parser = stdin_marker, conflicts_with_all = ["data", "file"])]
    stdin: Option<String>,
    /// The payload, as text.
    #[arg(long, conflicts_with = "file")]
    data: Option<String>,
    /// Read the payload from a file (`-` for stdin).
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// The message key (per-key ordering, routing).
    #[arg(long)]
    key: Option<String>,
    /// A message header, NAME=VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = args::key_value)]
    headers: Vec<(String, String)>,
    /// The message id, sent as the Idempotency-Key, which makes the publish idempotent:
    /// publishing the same id again within the broker's duplicate window stores nothing new
    /// and prints `"duplicate":true`. A fresh id when absent.
    #[arg(long)]
    id: Option<String>,
    /// Deliver the message this long from now, not before: `90s`, `2h`, `1h 30m`, `3d` (at
    /// most 365 days). The broker keeps it durably until then; `status` counts it as delayed.
    #[arg(long, value_name = "DURATION", value_parser = parse_delay, conflicts_with = "at")]
    delay: Option<String>,
    /// Deliver the message at this time, not before: RFC 3339, e.g. 2026-11-27T09:00:00Z. A time
    /// already past delivers at once.
    #[arg(long, value_name = "TIME", value_parser = parse_at)]
    at: Option<String>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// Checked here, so a typo fails before anything is sent.
fn parse_delay(text: &str) -> Result<String, String> {
    delay::parse_delay(text).map(|_| text.trim().to_owned())
}

fn parse_at(text: &str) -> Result<String, String> {
    parse_rfc3339_millis(text).map(|_| text.trim().to_owned())
}

fn stdin_marker(text: &str) -> Result<String, String> {
    match text {
        "-" => Ok(text.to_owned()),
        _ => Err(format!(
            "unexpected `{text}`: give the payload with --data, --file PATH, or `-` for stdin"
        )),
    }
}

pub(crate) fn run(args: Args) -> ExitCode {
    match publish(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}

fn publish(args: Args) -> Result<(), ClientError> {
    let payload = read_payload(&args)?;
    if let Some(id) = &args.id {
        check_id(id).map_err(ClientError::Usage)?;
    }
    let client = Client::connect(&args.connect)?;
    let receipt = client.publish(
        &args.topic,
        Outgoing {
            payload,
            key: args.key,
            headers: args.headers,
            id: args.id,
            delay: args.delay,
            deliver_at: args.at,
        },
    )?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &receipt)
        .map_err(|e| ClientError::Failed(format!("cannot write output: {e}")))?;
    writeln!(out).map_err(|e| ClientError::Failed(format!("cannot write output: {e}")))
}

fn read_payload(args: &Args) -> Result<Vec<u8>, ClientError> {
    let from_stdin =
        args.stdin.is_some() || args.file.as_ref().is_some_and(|p| p.as_os_str() == "-");
    if let Some(data) = &args.data {
        return Ok(data.clone().into_bytes());
    }
    if from_stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| ClientError::Usage(format!("cannot read the payload from stdin: {e}")))?;
        return Ok(buf);
    }
    match &args.file {
        Some(path) => std::fs::read(path).map_err(|e| {
            ClientError::Usage(format!(
                "{}: cannot read the payload file: {e}",
                path.display()
            ))
        }),
        None => Err(ClientError::Usage(
            "no payload: give --data TEXT, --file PATH, or `-` to read stdin".into(),
        )),
    }
}
