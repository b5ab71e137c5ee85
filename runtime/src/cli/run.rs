//! `sluice run`: the daemon.
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 2 when a pipeline
//! file is wrong (nothing is started), 1 when the daemon could not start or
//! failed while running.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::broker::embedded::SyncMode;
use crate::daemon::{self, DaemonError, DaemonOptions};
use crate::plugin::HostConfig;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Pipeline files, or directories of them (`*.yaml`, `*.yml`).
    #[arg(required = true, value_name = "FILE|DIR")]
    paths: Vec<PathBuf>,
    /// The broker for every pipeline, overriding their `broker:` field:
    /// `embedded`, or NATS JetStream as
    /// `nats://[user:pass@|token@]host:port[,host:port...][?replicas=3&creds=FILE&tls_ca=FILE]`
    /// (`tls://` requires TLS). Secrets can come from SLUICE_NATS_CREDS,
    /// SLUICE_NATS_TOKEN, SLUICE_NATS_USER/SLUICE_NATS_PASSWORD and
    /// SLUICE_NATS_TLS_CA instead.
    #[arg(long, env = "SLUICE_BROKER", value_name = "URL")]
    broker: Option<String>,
    /// Where the embedded broker keeps topics, cursors and leases. One daemon
    /// per directory: a second one is refused.
    #[arg(
        long,
        env = "SLUICE_DATA_DIR",
        value_name = "DIR",
        default_value = "sluice-data"
    )]
    data_dir: PathBuf,
    /// The admin HTTP address: /health, /metrics, ingest and the API that
    /// `sluice publish|tail|dlq|status` use.
    #[arg(long, env = "SLUICE_ADMIN", value_name = "ADDR", default_value = crate::admin::DEFAULT_ADMIN)]
    admin: SocketAddr,
    /// Durability of the embedded broker. `always`: every acknowledged write
    /// is fsynced (with group commit) and survives power loss. `os`: written
    /// to the operating system before it is acknowledged; survives a crash
    /// of the daemon (kill -9) but not of the machine.
    #[arg(
        long,
        env = "SLUICE_SYNC",
        value_name = "MODE",
        default_value = "always"
    )]
    sync: SyncArg,
    #[command(flatten)]
    cache: super::args::CacheArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SyncArg {
    Always,
    Os,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let host = HostConfig {
        cache_dir: args.cache.dir(),
        cache_max_bytes: args.cache.max_bytes(),
        ..HostConfig::default()
    };
    let opts = DaemonOptions {
        paths: args.paths,
        broker: args.broker,
        data_dir: args.data_dir,
        admin: args.admin,
        sync: match args.sync {
            SyncArg::Always => SyncMode::Always,
            SyncArg::Os => SyncMode::Os,
        },
        host,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice")
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(daemon::run(opts, shutdown_signal(), |started| {
        let names: Vec<String> = started
            .pipelines
            .iter()
            .map(|(name, stages)| {
                format!(
                    "{name} ({stages} stage{})",
                    if *stages == 1 { "" } else { "s" }
                )
            })
            .collect();
        eprintln!(
            "sluice: running {}; admin on http://{}; broker: {}",
            names.join(", "),
            started.admin,
            started.broker
        );
    }));
    // Work abandoned at the shutdown deadline (a blocking write on a dead
    // disk, say) must not hold the exit: the runtime waits for nothing more.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(DaemonError::Config(diagnostics)) => {
            eprintln!("{diagnostics}");
            let n = diagnostics.len();
            eprintln!(
                "{n} problem{} found; nothing was started",
                if n == 1 { "" } else { "s" }
            );
            ExitCode::from(2)
        }
        Err(err @ DaemonError::Unsupported(_)) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the daemon with kill -9");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
