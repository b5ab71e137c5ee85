//! The `sluice` command line.
//!
//! Each subcommand lives in its own file; this one parses arguments, sets up
//! logging and maps results to exit codes: 0 success, 1 the handler or the
//! operation failed, 2 the invocation or its inputs are wrong.

mod archive;
mod args;
mod cases;
mod client;
mod data;
mod dlq;
mod plugin_author;
mod plugin_test;
mod publish;
mod reload;
mod run;
mod schema;
mod stage;
mod state;
mod status;
mod table;
mod tail;
mod validate;

#[cfg(feature = "fuzz")]
pub(crate) use cases::parse as parse_cases;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sluice runs YAML pipelines whose handlers are sandboxed WebAssembly
/// components, with queues, retries, dead letters and backpressure around them.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run pipelines: the daemon.
    ///
    /// Checks every file and plugin first (exit 2 and nothing started if any is wrong),
    /// then opens the broker (the embedded one in --data-dir, or NATS JetStream with
    /// --broker nats://...), creates the topics' streams and the stages' consumers,
    /// serves the admin API on --admin and runs every stage until SIGTERM or SIGINT.
    /// Several daemons on the same pipelines and NATS share the work. On shutdown it
    /// stops fetching, lets in-flight messages finish within each pipeline's
    /// `shutdown_timeout`, returns the rest to the queue and exits 0. SIGHUP (or `sluice
    /// reload`, or a file change with --watch) reloads the files without a restart. Under
    /// systemd (Type=notify) it reports readiness and pings the watchdog. Logs go to stderr
    /// (filter with SLUICE_LOG).
    ///
    /// Example: sluice run pipelines/ --data-dir /var/lib/sluice --admin 127.0.0.1:7400
    ///
    /// Example: sluice run pipelines/ --broker nats://10.0.0.5:4222,10.0.0.6:4222?replicas=3
    Run(run::Args),
    /// Reload the running daemon's pipeline files and plugins without a restart.
    ///
    /// The daemon checks every file and plugin first, as at start-up; if any is wrong it
    /// changes nothing, keeps running its previous configuration, and this prints each
    /// problem as `file:line:col: message` and exits 2. Otherwise it applies only what
    /// changed: a stage with a new plugin build or new settings finishes its calls in
    /// flight (within its pipeline's shutdown_timeout) and goes on with the new ones; an
    /// added stage starts; a removed stage drains. Removing a topic that still holds
    /// messages is refused unless --force. Prints what changed and exits 0. SIGHUP and
    /// `sluice run --watch` do the same reload; `sluice status` shows the last one.
    ///
    /// Example: sluice reload   (systemd: ExecReload=sluice reload)
    Reload(reload::Args),
    /// Work with handler plugins (WebAssembly components).
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Check pipeline files: syntax, types, topics, names and plugins.
    ///
    /// Reports every problem, not only the first, each as `file:line:col: message` on
    /// stderr, and exits 2; on success prints `ok: <file> (pipeline <name>: N stages)` per
    /// pipeline and exits 0. A directory contributes its *.yaml and *.yml files. `${VAR}` and
    /// `${VAR:-default}` are expanded from the environment, as the daemon will. Each
    /// stage's plugin is read without compiling it (milliseconds, even for a Python or JS
    /// component): that it is a Sluice component of a known world and contract version,
    /// that it imports nothing the sandbox does not link, and that the stage's `memory`
    /// covers what it declares. `run` compiles it on first start and caches the result.
    ///
    /// Example: sluice validate pipelines/
    Validate(validate::Args),
    /// Print the JSON Schema of pipeline files, for editors.
    ///
    /// With the YAML language server (VS Code, Neovim, ...), save it and point pipeline files
    /// at it.
    ///
    /// Example: sluice schema > sluice.schema.json, then start a pipeline file with
    /// `# yaml-language-server: $schema=./sluice.schema.json`
    ///
    /// With --cases, the schema of handler test-case files (`sluice plugin test --cases`).
    /// With --openapi, the admin API's OpenAPI 3.1 document (as GET /v1/openapi.json).
    Schema(schema::Args),
    /// Publish one message to a topic, through the running daemon or straight to NATS.
    ///
    /// The payload comes from --data, --file PATH, or `-` (stdin). Prints what was stored as
    /// JSON: {"id", "topic", "seq", "duplicate"}. With --id the publish is idempotent: the
    /// same id again stores nothing and prints "duplicate":true. Exits 2 when the topic is
    /// unknown or the payload empty, 1 when the daemon (or NATS) is unreachable or the topic
    /// is over its high_water_mark (try again later). With --broker nats://... no daemon is
    /// needed; the embedded broker is only reachable through its daemon.
    ///
    /// Example: sluice publish orders --data '{"id":42}' --key customer-7 --header source=cli
    Publish(publish::Args),
    /// Print a topic's messages as JSON lines, without consuming them.
    ///
    /// Each line is {"seq", "id", "topic", "key", "headers", "payload", "published_at"},
    /// with "payload_base64" instead of "payload" when the bytes are not UTF-8. Starts with
    /// new messages (--from-start: with the oldest stored) and follows until Ctrl-C, or
    /// exits after --count messages. No stage's position moves. Through the running daemon,
    /// or with --broker nats://... straight from NATS, no daemon needed.
    ///
    /// Example: sluice tail orders.eu --from-start --count 10
    Tail(tail::Args),
    /// Inspect and act on a stage's dead-letter topic: list, show, redrive, purge.
    ///
    /// A stage is named PIPELINE/STAGE, as in the pipeline file. Through the running daemon,
    /// or with --broker nats://... straight on NATS, no daemon needed (there a stage's DLQ is
    /// topic PIPELINE.STAGE.dlq unless --pipelines gives the files that say otherwise).
    ///
    /// Example: sluice dlq list orders/route   (or with --broker nats://127.0.0.1:4222)
    #[command(subcommand)]
    Dlq(dlq::Command),
    /// Pause or resume a stage: a paused stage fetches nothing until resumed.
    ///
    /// Through the running daemon, or with --broker nats://... straight on NATS. The pause is
    /// kept by the broker, across restarts and (on NATS) for every daemon.
    ///
    /// Example: sluice stage pause orders/route
    #[command(subcommand)]
    Stage(stage::Command),
    /// Look into a stage's handler state store (`state:` in YAML): keys, values, deletes.
    ///
    /// Through the running daemon (--admin). Keys and sizes need the read token; values and
    /// deletes the full one.
    ///
    /// Example: sluice state list shop/charge
    #[command(subcommand)]
    State(state::Command),
    /// One line per stage of the running daemon: rate, backlog, oldest age, in-flight, DLQ.
    ///
    /// RATE is messages settled per second over the last 10 s; DEPTH the messages waiting
    /// for the stage; OLDEST the age of the oldest one it has not settled; IN-FLIGHT the
    /// deliveries it holds; DLQ its dead-letter count. A DEPTH that grows while RATE stays
    /// flat means the stage cannot keep up; an old OLDEST with IN-FLIGHT > 0 a stuck handler.
    ///
    /// Always asks a running daemon (--admin), whichever broker it runs on: the rates are
    /// sampled there. It takes no --broker; on NATS, ask any of the daemons.
    ///
    /// Example: sluice status   (or sluice status --json for scripts)
    Status(status::Args),
    /// Inspect and repair a stopped embedded data directory: check, salvage, quarantine.
    ///
    /// For when the daemon refuses to start on a damaged store, or a stage is stuck on a
    /// damaged block. None of them runs while a daemon holds the directory.
    ///
    /// Example: sluice data check --data-dir /var/lib/sluice
    #[command(subcommand)]
    Data(data::Command),
}

// Parsed once per process, like `Command`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Run a plugin once on one message and print what it emits.
    ///
    /// Each emit is printed as a JSON line: {"topic", "key", "headers", "payload"}, with
    /// "payload_base64" instead of "payload" when the bytes are not UTF-8. On failure the
    /// kind (retry, rejected, trap, timeout, out-of-memory, output-too-large,
    /// undeclared-topic) and message go to stderr and the exit code is 1. Plugin logs go to
    /// stderr.
    ///
    /// Example: sluice plugin test target/plugins/uppercase.wasm --data hello
    ///
    /// With --cases FILE, runs the file's test cases instead and prints one line per case,
    /// with what was expected beside what happened under each that failed (exit 1). The
    /// plugin may be a project directory, built first as by `sluice plugin build`.
    ///
    /// Example: sluice plugin test . --cases cases.yaml
    Test(plugin_test::Args),
    /// Create a handler project in Rust, Python or JavaScript.
    ///
    /// Creates the directory NAME with a handler that builds (it upper-cases text, rejects
    /// an empty payload and retries what starts with `later`: replace it with yours), a
    /// README and its test cases (cases.yaml). The project carries what it needs: the
    /// contract's WIT and the language's SDK. Nothing existing is overwritten.
    ///
    /// Example: sluice plugin new enrich --lang python
    New(plugin_author::NewArgs),
    /// Build the handler project in DIR into a WebAssembly component.
    ///
    /// Runs the language's own toolchain: cargo (target wasm32-wasip2), componentize-py, or
    /// componentize-js (from the project's node_modules). It installs nothing: a missing tool
    /// is named with the command that installs it. Tool output goes to stderr; the last line
    /// of stdout is the path of the built .wasm. A Python or JS project whose files did not
    /// change is not rebuilt.
    ///
    /// Example: sluice plugin build enrich
    Build(plugin_author::BuildArgs),
}

/// Parses the command line, runs the command and returns its exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The commands that talk to a broker print their own results; only
    // warnings (a lost connection) are worth adding on stderr.
    let quiet = matches!(
        cli.command,
        Command::Publish(_)
            | Command::Tail(_)
            | Command::Dlq(_)
            | Command::Stage(_)
            | Command::State(_)
            | Command::Status(_)
            | Command::Reload(_)
            | Command::Data(_)
    );
    // Only the daemon exports traces; a bad setting is refused before
    // anything starts.
    let otel = match &cli.command {
        Command::Run(args) => match crate::otel::Export::from_env(args.otlp()) {
            Ok(export) => export,
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    init_logging(if quiet { "warn" } else { "info" }, otel.as_ref());
    if let Some(export) = &otel {
        tracing::info!(endpoint = %export.endpoint(), "exporting traces over OTLP");
    }
    let code = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Plugin(PluginCommand::Test(args)) => plugin_test::run(args),
        Command::Plugin(PluginCommand::New(args)) => plugin_author::new(args),
        Command::Plugin(PluginCommand::Build(args)) => plugin_author::build(args),
        Command::Validate(args) => validate::run(args),
        Command::Schema(args) => schema::run(args),
        Command::Publish(args) => publish::run(args),
        Command::Tail(args) => tail::run(args),
        Command::Dlq(command) => dlq::run(command),
        Command::Stage(command) => stage::run(command),
        Command::State(command) => state::run(command),
        Command::Status(args) => status::run(args),
        Command::Reload(args) => reload::run(args),
        Command::Data(command) => data::run(command),
    };
    // Sends the spans still queued (the async runtime is gone by now).
    if let Some(export) = otel {
        export.shutdown();
    }
    code
}

/// Logs to stderr; `SLUICE_LOG` (or `RUST_LOG`) sets the filter, `level` by
/// default with the storage engine's housekeeping quieted and lapin (the
/// AMQP client) silent: the AMQP connector reports its errors itself,
/// scrubbed, once per outage, where lapin logs every failed reconnect and
/// every returned message with its payload. Colours only on a
/// terminal, so logs piped to a file or journald stay plain text.
///
/// With trace export on, the spans go to their own layer (`otel`), and the
/// log leaves them out.
fn init_logging(level: &str, otel: Option<&crate::otel::Export>) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter = std::env::var("SLUICE_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{level},fjall=warn,lsm_tree=warn,lapin=off")))
        .add_directive(
            format!("{}=off", crate::otel::TARGET)
                .parse()
                .expect("a static directive"),
        );
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(filter);
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(otel.map(crate::otel::Export::layer))
        .try_init();
}
