//! `sluice state list|get|delete <PIPELINE>/<STAGE> [KEY]`: a stage's
//! handler state store, through the running daemon.

use std::io::Write;
use std::process::ExitCode;

use super::client::{AdminArgs, Client, ClientError};
use super::dlq::{StageRef, stage_ref};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// The keys of a stage's state store, with their sizes, revisions and expiry; no values.
    ///
    /// The read token is enough. The first line gives the store's totals against its
    /// max_bytes. Keys come in order, 1,000 at a time; --after KEY goes on from KEY.
    ///
    /// Example: sluice state list shop/charge --prefix order/
    List {
        /// The stage, as PIPELINE/STAGE.
        #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
        stage: StageRef,
        /// Only keys that start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Only keys after this one.
        #[arg(long)]
        after: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Print one value (as stored: text stays text, bytes stay bytes).
    ///
    /// Needs the full token: values are the handler's data. Exits 1 when the key is absent.
    ///
    /// Example: sluice state get shop/charge order/1042
    Get {
        /// The stage, as PIPELINE/STAGE.
        #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
        stage: StageRef,
        /// The key.
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete one key, committed as a handler's delete: a call that read it meanwhile runs again.
    ///
    /// Needs the full token.
    ///
    /// Example: sluice state delete shop/charge lock/order/1042
    Delete {
        /// The stage, as PIPELINE/STAGE.
        #[arg(value_name = "PIPELINE/STAGE", value_parser = stage_ref)]
        stage: StageRef,
        /// The key.
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

pub(crate) fn run(command: Command) -> ExitCode {
    match go(command) {
        Ok(code) => code,
        Err(err) => err.report(),
    }
}

fn write_err(e: std::io::Error) -> ClientError {
    ClientError::Failed(format!("cannot write output: {e}"))
}

fn go(command: Command) -> Result<ExitCode, ClientError> {
    let mut out = std::io::stdout().lock();
    match command {
        Command::List {
            stage,
            prefix,
            after,
            admin,
        } => {
            let client = Client::daemon(&admin)?;
            let page =
                client.state_list(&stage.pipeline, &stage.stage, &prefix, after.as_deref())?;
            writeln!(
                out,
                "store {}: {} keys, {} of {} bytes",
                page.store, page.keys, page.bytes, page.max_bytes
            )
            .map_err(write_err)?;
            let rows: Vec<Vec<String>> = page
                .entries
                .iter()
                .map(|e| {
                    vec![
                        e.key.clone(),
                        e.size.to_string(),
                        e.revision.to_string(),
                        e.expires_at.map_or_else(
                            || "-".to_owned(),
                            crate::timestamp::format_rfc3339_millis,
                        ),
                    ]
                })
                .collect();
            super::table::print(&mut out, &["KEY", "SIZE", "REVISION", "EXPIRES"], &rows)
                .map_err(write_err)?;
            if page.more
                && let Some(last) = page.entries.last()
            {
                writeln!(out, "(more: --after {:?})", last.key).map_err(write_err)?;
            }
        }
        Command::Get { stage, key, admin } => {
            let client = Client::daemon(&admin)?;
            let value = client.state_get(&stage.pipeline, &stage.stage, &key)?;
            match (value.value, value.value_base64) {
                (Some(text), _) => out.write_all(text.as_bytes()),
                (None, Some(b64)) => {
                    use base64::Engine as _;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|e| {
                            ClientError::Failed(format!("the daemon sent bad base64: {e}"))
                        })?;
                    out.write_all(&bytes)
                }
                (None, None) => Ok(()),
            }
            .map_err(write_err)?;
        }
        Command::Delete { stage, key, admin } => {
            let client = Client::daemon(&admin)?;
            let deleted = client.state_delete(&stage.pipeline, &stage.stage, &key)?;
            writeln!(
                out,
                "{} {key:?} in {stage}",
                if deleted.deleted { "deleted" } else { "no key" }
            )
            .map_err(write_err)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
