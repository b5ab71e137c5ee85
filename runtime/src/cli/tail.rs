//! `sluice tail`: print a topic's messages as JSON lines, without consuming
//! them: no stage's cursor moves.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;
use std::time::Duration;

use super::client::{Client, ClientError, ConnectArgs};

/// How long one long-poll waits for new messages.
const POLL: Duration = Duration::from_secs(25);
/// Messages asked for per request.
const PAGE: u64 = 500;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The topic: one a loaded pipeline declares, or a stage's DLQ topic; with a NATS
    /// --broker and no --pipelines, any topic NATS has a stream for.
    topic: String,
    /// Exit after printing N messages (otherwise follow until Ctrl-C).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Start at the oldest stored message instead of only new ones.
    #[arg(long)]
    from_start: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub(crate) fn run(args: Args) -> ExitCode {
    match tail(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}

fn tail(args: &Args) -> Result<(), ClientError> {
    if args.count == Some(0) {
        return Ok(());
    }
    let client = Client::connect(&args.connect)?;
    // Where to start: a read picks the oldest stored message when `from`
    // is absent; "only new ones" starts past the newest.
    let mut from = if args.from_start {
        None
    } else {
        Some(client.topic(&args.topic)?.last_seq + 1)
    };
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let max = args.count.map_or(PAGE, |n| (n - printed).min(PAGE));
        let page = client.read(&args.topic, from, max, POLL)?;
        for message in &page.messages {
            let written = serde_json::to_writer(&mut out, message)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"));
            match written {
                Ok(()) => {}
                // `sluice tail t | head`: the reader is gone, which is fine.
                Err(e) if e.kind() == ErrorKind::BrokenPipe => return Ok(()),
                Err(e) => return Err(ClientError::Failed(format!("cannot write output: {e}"))),
            }
            printed += 1;
            if args.count == Some(printed) {
                return flush(&mut out);
            }
        }
        flush(&mut out)?;
        from = Some(page.next);
    }
}

fn flush(out: &mut impl Write) -> Result<(), ClientError> {
    match out.flush() {
        Err(e) if e.kind() != ErrorKind::BrokenPipe => {
            Err(ClientError::Failed(format!("cannot write output: {e}")))
        }
        _ => Ok(()),
    }
}
