//! `sluice plugin test`: the handler author's inner loop. Runs a plugin once,
//! in the same sandbox and under the same limits as the daemon, and prints
//! what it emitted.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Serialize;

use super::{args, cases};
use crate::plugin::{Emit, HostConfig, Limits, Message, Outputs, WorkerSettings};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The plugin: a WebAssembly component (e.g. target/plugins/uppercase.wasm), or a
    /// plugin project directory (built first, as by `sluice plugin build`).
    plugin: PathBuf,
    /// Run the test cases in FILE instead of one message: each case's input and the
    /// outcome it expects (see docs/cases.md; `sluice schema --cases`). A mismatch prints
    /// what was expected beside what happened; the exit code is 1 if any case fails.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["data", "file", "key", "headers", "id", "topic", "attempt"])]
    cases: Option<PathBuf>,
    /// Replay one dead letter, PIPELINE/STAGE/SEQ (as `sluice dlq list` shows it), fetched
    /// through the running daemon (--admin) or NATS (--broker): the message as its handler saw
    /// it. Passes (exit 0) when the plugin now handles it without failing; give the stage's
    /// config with --config and its outputs with --publish.
    #[arg(long, value_name = "PIPELINE/STAGE/SEQ", value_parser = super::dlq::entry_ref,
          conflicts_with_all = ["cases", "data", "file", "key", "headers", "id", "topic", "attempt"])]
    from_dlq: Option<super::dlq::EntryRef>,
    #[command(flatten)]
    connect: super::client::ConnectArgs,
    /// The payload, as text.
    #[arg(long, conflicts_with = "file")]
    data: Option<String>,
    /// Read the payload from a file (`-` for stdin). Without --data or --file the payload is empty.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// The message key.
    #[arg(long)]
    key: Option<String>,
    /// A message header, NAME=VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = args::key_value)]
    headers: Vec<(String, String)>,
    /// A stage config entry the plugin reads with config-get, KEY=VALUE (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = args::key_value)]
    config: Vec<(String, String)>,
    /// A secret the plugin may read (contract 0.2.0, `sluice:plugin/secrets`), named as in a
    /// pipeline's `secrets:` block and read from `env:VAR` or `file:PATH`, never given as a
    /// value (repeatable). Its value is removed from the plugin's log lines and failure reasons.
    /// Example: --secret api_token=env:PAYMENTS_TOKEN
    #[arg(long = "secret", value_name = "NAME=env:VAR|file:PATH", value_parser = args::key_value)]
    secrets: Vec<(String, String)>,
    /// A declared output topic (repeatable); the first is the default output. Without any,
    /// every topic is allowed and the default output is called `out`.
    #[arg(long = "publish", value_name = "TOPIC")]
    publish: Vec<String>,
    /// The per-call timeout.
    #[arg(long, default_value = "30s", value_parser = args::duration)]
    timeout: Duration,
    /// The memory limit, summed over the instance's memories.
    #[arg(long, default_value = "256MiB", value_parser = args::byte_size)]
    memory: usize,
    /// The message id the handler sees.
    #[arg(long, default_value = "test-1")]
    id: String,
    /// The topic the message appears to come from.
    #[arg(long, default_value = "test")]
    topic: String,
    /// The delivery attempt the handler sees (1 = first delivery).
    #[arg(long, default_value_t = 1)]
    attempt: u32,
    #[command(flatten)]
    cache: args::CacheArgs,
}

/// One emit as printed: a JSON line.
#[derive(Serialize)]
struct PrintedEmit<'a> {
    topic: &'a str,
    key: Option<&'a str>,
    headers: &'a [(String, String)],
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

pub(crate) fn run(args: Args) -> ExitCode {
    // The cases (or the dead letter) first: a mistake in them is reported
    // before a project is built, which takes seconds for Python or JS.
    let cases = match load_cases(&args) {
        Ok(cases) => cases,
        Err(code) => return code,
    };
    let (plugin, settings, payload) = match prepare(&args) {
        Ok(prepared) => prepared,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    if let Some((loaded, source)) = cases {
        return runtime.block_on(run_cases(&plugin, settings, &loaded, &source));
    }
    run_once(&args, &runtime, plugin, settings, payload)
}

/// The cases file (with its name, for messages) or the dead letter to
/// replay (fetched now, before any async runtime starts: the client
/// blocks), or None for a single run. A mistake is printed, and its exit
/// code (2) given back.
fn load_cases(args: &Args) -> Result<Option<(cases::Loaded, String)>, ExitCode> {
    match (&args.cases, &args.from_dlq) {
        (Some(path), _) => match cases::load(path) {
            Ok(cases) => Ok(Some((cases, path.display().to_string()))),
            Err(err) => {
                eprintln!("error: {err}");
                Err(ExitCode::from(2))
            }
        },
        (None, Some(entry)) => match entry.fetch(&args.connect) {
            Ok(detail) => {
                let stage = entry.stage.to_string();
                if let Some(why) = cases::dlq_case_refusal(&stage, entry.seq, &detail) {
                    eprintln!("error: {why}");
                    return Err(ExitCode::from(2));
                }
                eprintln!(
                    "replaying dead letter {} of {stage}, which failed with {}",
                    entry.seq,
                    cases::dlq_failure(&detail)
                );
                Ok(Some((
                    cases::Loaded::dead_letter(&stage, entry.seq, &detail),
                    String::new(),
                )))
            }
            // Not 1: that would read as "the handler still fails".
            Err(err) => {
                eprintln!("error: cannot fetch the dead letter: {err}");
                Err(ExitCode::from(2))
            }
        },
        (None, None) => Ok(None),
    }
}

/// The plugin (built first if it is a project) loaded under the limits
/// given, the settings its worker runs with, and the payload of a single
/// run; or what went wrong, to print after `error: `.
fn prepare(args: &Args) -> Result<(crate::plugin::Plugin, WorkerSettings, Vec<u8>), String> {
    let wasm = super::plugin_author::component(&args.plugin).map_err(|err| err.to_string())?;
    let payload = read_payload(args)?;
    let host = args
        .cache
        .host(HostConfig {
            max_instances: 4,
            max_memory: args.memory.max(1 << 20),
            ..HostConfig::default()
        })
        .map_err(|err| err.to_string())?;
    let plugin = host.load(&wasm).map_err(|err| err.to_string())?;
    let mut secrets = BTreeMap::new();
    for (name, spec) in &args.secrets {
        let value = crate::config::read_secret_spec(name, spec)
            .map_err(|why| format!("--secret {name}: {why}"))?;
        secrets.insert(name.clone(), value);
    }
    // State and HTTP are always granted here: each run (each case) gets a
    // store in memory of its own, and a script of HTTP answers (a case's
    // `http:`; none for a single run, which refuses every request).
    let mut granted = vec![
        crate::plugin::Capability::State,
        crate::plugin::Capability::Http,
    ];
    if !secrets.is_empty() {
        granted.push(crate::plugin::Capability::Secrets);
    }
    plugin
        .check_grants("plugin test", &granted)
        .map_err(|err| {
            format!("{err}; with `plugin test`, give each with --secret NAME=env:VAR")
        })?;
    let settings = WorkerSettings {
        limits: Limits {
            timeout: args.timeout,
            memory: args.memory,
            ..Limits::default()
        },
        secrets: crate::plugin::GuestSecrets::new("plugin test", secrets),
        config: Arc::new(args.config.iter().cloned().collect::<BTreeMap<_, _>>()),
        outputs: if args.publish.is_empty() {
            Outputs::Any {
                default: "out".into(),
            }
        } else {
            Outputs::Declared(args.publish.clone())
        },
        ..WorkerSettings::default()
    };
    Ok((plugin, settings, payload))
}

/// One message, built from the arguments, handled once: its emits on
/// stdout, the state it would commit and the requests it tried on stderr.
fn run_once(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    plugin: crate::plugin::Plugin,
    settings: WorkerSettings,
    payload: Vec<u8>,
) -> ExitCode {
    let message = Message {
        id: args.id.clone(),
        topic: args.topic.clone(),
        key: args.key.clone(),
        headers: args.headers.clone(),
        payload,
        attempt: args.attempt,
        published_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    let (mut settings, store) = with_memory_state(settings, std::iter::empty());
    let script = Arc::new(crate::plugin::Script::default());
    settings.http = Some(crate::plugin::HttpSender::Script(script.clone()));
    let (outcome, writes) = runtime.block_on(async move {
        let mut worker = plugin.worker(settings);
        let outcome = worker.handle(&message).await;
        (outcome, worker.take_state())
    });
    for request in script.unexpected() {
        eprintln!(
            "http: {request} was refused: a single run makes no requests (give a cases file \
             with the case's `http:` exchanges)"
        );
    }
    // What the call would commit with its outputs, on stderr: the outputs
    // stay alone on stdout for scripts.
    if let (Ok(_), Some(writes)) = (&outcome, &writes)
        && store.commit(writes, crate::broker::now_millis()).is_ok()
    {
        for (key, value) in store.values(crate::broker::now_millis()) {
            eprintln!("state: {key} = {}", String::from_utf8_lossy(&value));
        }
    }
    match outcome {
        Ok(emits) => match print_emits(&emits) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: cannot write output: {err}");
                ExitCode::FAILURE
            }
        },
        Err(failure) => {
            eprintln!("{}: {}", failure.kind, failure.message);
            ExitCode::FAILURE
        }
    }
}

/// Runs every case of `loaded` and prints one line per case, with the
/// difference under each that failed.
async fn run_cases(
    plugin: &crate::plugin::Plugin,
    base: WorkerSettings,
    loaded: &cases::Loaded,
    source: &str,
) -> ExitCode {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let file = &loaded.file;
    let (mut passed, mut failed) = (0, 0);
    let mut out = std::io::stdout().lock();
    for (i, (case, pos)) in file.cases.iter().zip(&loaded.positions).enumerate() {
        let mut config = (*base.config).clone();
        config.extend(file.config.clone());
        config.extend(case.config.clone());
        let settings = WorkerSettings {
            config: Arc::new(config),
            outputs: if file.publish.is_empty() {
                base.outputs.clone()
            } else {
                Outputs::Declared(file.publish.clone())
            },
            ..base.clone()
        };
        let message = case.input.message(i + 1, now);
        let (mut settings, store) = with_memory_state(
            settings,
            case.state
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes())),
        );
        let script = Arc::new(case.script());
        settings.http = Some(crate::plugin::HttpSender::Script(script.clone()));
        let mut worker = plugin.worker(settings);
        let got = worker.handle(&message).await;
        // As the daemon does: an `ok` commits the call's writes, anything
        // else drops them.
        if let (Ok(_), Some(writes)) = (&got, worker.take_state())
            && let Err(why) = store.commit(&writes, now)
        {
            tracing::warn!("case {}: {why}", case.name);
        }
        let got_state = store.values(now);
        // A replayed dead letter has no file to point into.
        let place = if source.is_empty() {
            String::new()
        } else {
            format!(" ({source}:{}:{})", pos.line, pos.col)
        };
        let line = match cases::check_http(&script)
            .or_else(|| cases::check(&case.expect, &got))
            .or_else(|| cases::check_state(&case.expect, &got_state))
        {
            None => {
                passed += 1;
                format!("ok    {}{place}", case.name)
            }
            Some(diff) => {
                failed += 1;
                format!("FAIL  {}{place}\n{diff}", case.name)
            }
        };
        if writeln!(out, "{line}").is_err() {
            return ExitCode::FAILURE;
        }
    }
    let _ = writeln!(out, "\n{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `settings` with a store in memory holding `entries`, and the store.
fn with_memory_state(
    mut settings: WorkerSettings,
    entries: impl IntoIterator<Item = (String, Vec<u8>)>,
) -> (WorkerSettings, Arc<crate::state::MemoryState>) {
    let store = Arc::new(crate::state::MemoryState::with(entries));
    settings.state = Some(crate::state::StateAccess {
        reader: store.clone(),
        store: "plugin-test/state".into(),
        max_bytes: crate::config::DEFAULT_STATE_MAX_BYTES.bytes(),
    });
    (settings, store)
}

fn read_payload(args: &Args) -> Result<Vec<u8>, String> {
    match (&args.data, &args.file) {
        (Some(data), _) => Ok(data.clone().into_bytes()),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("cannot read the payload from stdin: {e}"))?;
            Ok(buf)
        }
        (None, Some(path)) => std::fs::read(path)
            .map_err(|e| format!("{}: cannot read the payload file: {e}", path.display())),
        (None, None) => Ok(Vec::new()),
    }
}

fn print_emits(emits: &[Emit]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for emit in emits {
        let text = std::str::from_utf8(&emit.payload).ok();
        let printed = PrintedEmit {
            topic: &emit.topic,
            key: emit.key.as_deref(),
            headers: &emit.headers,
            payload: text,
            payload_base64: text
                .is_none()
                .then(|| base64::engine::general_purpose::STANDARD.encode(&emit.payload)),
        };
        serde_json::to_writer(&mut out, &printed)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
