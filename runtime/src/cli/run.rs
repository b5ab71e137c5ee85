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
    #[command(flatten)]
    tokens: super::args::TokenArgs,
    /// Serve the admin API without a token on a non-loopback address. Anyone
    /// who reaches it can then publish, purge and redrive.
    #[arg(long)]
    admin_insecure: bool,
    /// Another name the admin API may be reached by (the `Host` header), for
    /// example a proxy's or a DNS name: NAME or NAME:PORT. Repeatable. The
    /// bound address and localhost are always accepted.
    #[arg(long, value_name = "HOST")]
    admin_allowed_host: Vec<String>,
    /// Serve the admin API over TLS with this PEM certificate chain (needs
    /// --admin-tls-key).
    #[arg(long, value_name = "FILE", requires = "admin_tls_key")]
    admin_tls_cert: Option<PathBuf>,
    /// The PEM private key of --admin-tls-cert.
    #[arg(long, value_name = "FILE", requires = "admin_tls_cert")]
    admin_tls_key: Option<PathBuf>,
    /// How long a client may take to send a request's headers, or stay idle
    /// between requests, before the admin API closes its connection.
    #[arg(long, env = "SLUICE_ADMIN_HEADER_TIMEOUT", value_name = "DURATION",
          value_parser = super::args::duration, default_value = "10s", hide = true)]
    admin_header_timeout: std::time::Duration,
    /// The most connections the admin API keeps open at once.
    #[arg(long, env = "SLUICE_ADMIN_MAX_CONNECTIONS", value_name = "N",
          default_value_t = crate::admin::DEFAULT_MAX_CONNECTIONS, hide = true)]
    admin_max_connections: usize,
    /// The most request-body bytes held at once across all ingest requests;
    /// past it ingest answers 503 with Retry-After.
    #[arg(long, env = "SLUICE_ADMIN_BODY_BUDGET", value_name = "SIZE",
          value_parser = super::args::byte_size, default_value = "256MiB")]
    admin_body_budget: usize,
    /// How long a request body may pause between two parts before the
    /// admin API drops the request (408) and frees its share of the budget.
    #[arg(long, env = "SLUICE_ADMIN_BODY_IDLE_TIMEOUT", value_name = "DURATION",
          value_parser = super::args::duration, default_value = "30s", hide = true)]
    admin_body_idle_timeout: std::time::Duration,
    /// Reload when a pipeline file (or a file added to a directory given) or a stage's
    /// plugin changes, once the files have stood still for half a second: for development,
    /// or a deploy that writes files in place. The same reload as SIGHUP and `sluice
    /// reload`: an invalid set changes nothing and is logged.
    #[arg(long)]
    watch: bool,
    /// Export a span per stage attempt over OTLP/HTTP (protobuf) to the collector at URL,
    /// as OTEL_EXPORTER_OTLP_ENDPOINT does (`/v1/traces` is added), which it overrides.
    /// The standard OTEL_* variables set the rest: OTEL_EXPORTER_OTLP_HEADERS,
    /// OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_BSP_*. With neither set, no span is made.
    ///
    /// Example: sluice run pipelines/ --otlp http://127.0.0.1:4318
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
}

impl Args {
    /// The `--otlp` endpoint, if given.
    pub(crate) fn otlp(&self) -> Option<&str> {
        self.otlp.as_deref()
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SyncArg {
    Always,
    Os,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let access = match admin_access(&args) {
        Ok(access) => access,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
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
        admin_access: access,
        admin_insecure: args.admin_insecure,
        admin_tls: args.admin_tls_cert.zip(args.admin_tls_key),
        admin_limits: crate::admin::ServerLimits {
            header_timeout: args.admin_header_timeout,
            max_connections: args.admin_max_connections,
            body_budget: args.admin_body_budget,
            body_idle: args.admin_body_idle_timeout,
        },
        watch: args.watch,
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
    // The handlers are installed before the daemon starts, so a SIGTERM
    // sent as soon as it says READY=1 is a clean shutdown, not the
    // signal's default action (an immediate exit).
    let shutdown = {
        let _runtime = runtime.enter();
        shutdown_signal()
    };
    let result = runtime.block_on(daemon::run(opts, shutdown, |started| {
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
            "sluice: running {}; admin on {}://{}; broker: {}",
            names.join(", "),
            started.admin_scheme,
            started.admin,
            started.broker
        );
        crate::service::ready(&format!(
            "running {}; admin on {}://{}",
            names.join(", "),
            started.admin_scheme,
            started.admin
        ));
        crate::service::spawn_watchdog();
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
        Err(
            err @ (DaemonError::Unsupported(_)
            | DaemonError::InsecureAdmin(_)
            | DaemonError::AdminTls(_)),
        ) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The admin API's access rules from the flags and environment.
fn admin_access(args: &Args) -> Result<crate::admin::AccessConfig, String> {
    use crate::admin::Token;
    let full = args.tokens.full()?;
    let read = args.tokens.read()?;
    if read.is_some() && full.is_none() {
        return Err(
            "a read-only admin token is set but no full-access one: set SLUICE_ADMIN_TOKEN or --admin-token-file too, or nothing could change the daemon through its API".into(),
        );
    }
    Ok(crate::admin::AccessConfig {
        full: full.and_then(|t| Token::new(&t.text)),
        read: read.and_then(|t| Token::new(&t.text)),
        allowed_hosts: args.admin_allowed_host.clone(),
    })
}

/// Installs the SIGTERM and SIGINT handlers (inside the runtime) and
/// returns what resolves on the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(term), Ok(int)) = signals else {
            tracing::error!("cannot install signal handlers; stop the daemon with kill -9");
            return std::future::pending().await;
        };
        first_stop_signal(term, int).await;
    }
}

/// Waits for SIGTERM or SIGINT, then tells the service manager the drain
/// has begun.
async fn first_stop_signal(
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
) {
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    crate::service::stopping();
}
