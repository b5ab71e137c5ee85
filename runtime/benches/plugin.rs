//! Plugin host benchmarks, each comparison measured side by side in one run.
//!
//! `cargo bench -p sluice --bench plugin` (or `cargo xtask bench`) prints a
//! Markdown table; BENCHMARKS.md records a run. Samples of the two sides of a
//! comparison alternate (A, B, A, B, ...) so that noise from a shared machine
//! lands on both, and each figure is the median over samples. Ratios are the
//! figures to read; absolute times on a shared machine are noise.
//!
//! - **wasm boundary**: an identity handler through the wasm boundary against
//!   the same logic in native Rust, per message, at 128 B and 4 KiB, for the
//!   `handler` world (one call per message) and `batch-handler` at batch 64.
//! - **epoch interruption**: a CPU-bound handler with epoch checks compiled in
//!   against the same handler without them.
//!   A third row repeats batch 64 with bare messages (no key or headers), to
//!   show how much of the cost is the per-field lowering.
//! - **start-up**: loading the example plugins cold (compiling) against warm
//!   (from the compile cache).
//! - **languages**: one call of the uppercase example (64 B) in Rust against
//!   Python and JavaScript, through each SDK and against the raw bindings
//!   (`raw-py`, `raw-js`: the toolchain's floor), JavaScript on
//!   SpiderMonkey (`-js`) and on QuickJS (`-qjs`), and componentize-qjs for
//!   comparison; and the Python and JS components' first compile
//!   against their start from the compile cache (3 samples: a compile takes
//!   seconds). `languages/NAME` (e.g. `languages/uppercase-qjs`) runs that
//!   one call row alone, for a profiler; `languages//path/to/x.wasm` a
//!   component of one's own.

#![allow(missing_docs)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::plugin::{Emit, HostConfig, Message, PluginHost, Worker, WorkerSettings};

/// The same allocator as the `sluice` binary, so both sides of every
/// comparison allocate the way the daemon does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Samples per side of a comparison.
const SAMPLES: usize = 31;

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects sections.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants =
        |section: &str| filter.is_empty() || filter.iter().any(|f| section.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let host = PluginHost::new(HostConfig {
        max_instances: 16,
        max_memory: 256 << 20,
        ..HostConfig::default()
    })
    .expect("plugin host");

    println!(
        "| benchmark | native / epoch off / warm | wasm / epoch on / cold | overhead | ratio |"
    );
    println!("|---|---|---|---|---|");
    if wants("boundary-single") || wants("boundary-batch") || wants("boundary-bare") {
        boundary(&rt, &host, &wants);
    }
    if wants("epoch") {
        epoch(&rt);
    }
    if wants("startup") {
        startup();
    }
    // `languages/NAME` runs that row of the section alone (e.g. under perf).
    let only: Vec<&str> = filter
        .iter()
        .filter_map(|f| f.strip_prefix("languages/"))
        .collect();
    if wants("languages") || !only.is_empty() {
        languages(&rt, &host, &only);
    }
}

/// Per-call cost of the uppercase example in each language, and the Python
/// and JS components' first compile against their start from the cache.
fn languages(rt: &tokio::runtime::Runtime, host: &PluginHost, only: &[&str]) {
    let wanted = |name: &str| only.is_empty() || only.contains(&name);
    let msg = message(64, 0);
    let worker = |name: &str| {
        host.load(sluice_harness::plugin(name))
            .expect(name)
            .worker(WorkerSettings::default())
    };
    let mut rust = worker("uppercase");
    // `raw-py` and `raw-js` are the same upper-casing against the raw
    // bindings, no SDK: the toolchain's own floor for one call (`raw-js`
    // also makes one `log` host call at debug level). `-qjs` is the same
    // JavaScript on the QuickJS engine (`plugins/js/engine-quickjs`).
    let mut others: Vec<(String, Worker)> = [
        "uppercase-py",
        "raw-py",
        "uppercase-js",
        "raw-js",
        "uppercase-qjs",
        "raw-qjs",
    ]
    .into_iter()
    .filter(|name| wanted(name))
    .map(|name| (name.to_owned(), worker(name)))
    .collect();
    // A path ending in `.wasm` is measured as it is: for trying variants.
    for path in only.iter().filter(|n| n.ends_with(".wasm")) {
        let plugin = host.load(Path::new(path)).expect(path);
        others.push(((*path).to_owned(), plugin.worker(WorkerSettings::default())));
    }
    if wanted("componentize-qjs") {
        match componentize_qjs() {
            Ok(path) => others.push((
                "componentize-qjs".to_owned(),
                host.load(&path)
                    .expect("componentize-qjs")
                    .worker(WorkerSettings::default()),
            )),
            Err(e) => eprintln!("componentize-qjs row skipped: {e}"),
        }
    }
    for (other, mut measured) in others {
        let (base, time) = compare(
            2_000,
            |n| rt.block_on(wasm_single(&mut rust, &msg, n)),
            |n| rt.block_on(wasm_single(&mut measured, &msg, n)),
        );
        row(
            &format!("one call, 64 B: uppercase (Rust) | {other}"),
            base,
            time,
        );
    }
    for name in ["uppercase-py", "uppercase-js", "uppercase-qjs"] {
        if !only.is_empty() {
            break;
        }
        let path = sluice_harness::plugin(name);
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let cache = tempfile::tempdir().expect("tempdir");
            let host = PluginHost::new(HostConfig {
                cache_dir: Some(cache.path().to_owned()),
                max_instances: 4,
                max_memory: 256 << 20,
                ..HostConfig::default()
            })
            .expect("plugin host");
            cold.push(load(&host, &path, 1));
            warm.push(load(&host, &path, 1));
        }
        row(
            &format!("start-up, load `{name}` (warm = from cache, cold = first compile)"),
            median(warm),
            median(cold),
        );
    }
}

/// The uppercase handler built with componentize-qjs `--sync` (the release
/// `plugins/js/package-lock.json` pins, through jco), for comparison only:
/// `sluice plugin build` does not offer it.
fn componentize_qjs() -> Result<PathBuf, String> {
    let root = sluice_harness::repo_root();
    let js = root.join("plugins/js");
    let out = root.join("target/plugins/componentize-qjs.wasm");
    std::fs::create_dir_all(root.join("target/plugins")).map_err(|e| e.to_string())?;
    let status = std::process::Command::new("node")
        .arg(js.join("node_modules/componentize-qjs/bin/componentize-qjs"))
        .args(["--sync", "-n", "handler", "-w"])
        .arg(root.join("wit"))
        .arg("-j")
        .arg(js.join("testkit/componentize-qjs/handler.js"))
        .arg("-o")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("node: {e}"))?;
    if status.success() {
        Ok(out)
    } else {
        Err(format!("componentize-qjs failed ({status})"))
    }
}

/// The same logic as the `identity` plugin, natively.
#[inline(never)]
fn native_identity(msg: &Message) -> Vec<Emit> {
    vec![Emit {
        topic: "out".into(),
        key: msg.key.clone(),
        headers: msg.headers.clone(),
        payload: msg.payload.clone(),
    }]
}

fn message(size: usize, i: usize) -> Message {
    let mut msg = Message::new(format!("msg-{i:08}"), "bench.in", vec![b'x'; size]);
    msg.key = Some("customer-42".into());
    msg.headers = vec![("content-type".into(), "application/octet-stream".into())];
    msg
}

fn boundary(rt: &tokio::runtime::Runtime, host: &PluginHost, wants: &dyn Fn(&str) -> bool) {
    let single = host
        .load(sluice_harness::plugin("identity"))
        .expect("load identity");
    let batch = host
        .load(sluice_harness::plugin("identity-batch"))
        .expect("load identity-batch");
    for size in [128, 4096] {
        let msgs: Vec<Message> = (0..64).map(|i| message(size, i)).collect();

        if wants("boundary-single") {
            let mut worker = single.worker(WorkerSettings::default());
            let (native, wasm) = compare(
                2_000,
                |n| per_message(n, 1, || black_box(native_identity(black_box(&msgs[0])))),
                |n| rt.block_on(wasm_single(&mut worker, &msgs[0], n)),
            );
            row(
                &format!("wasm boundary, handler, batch 1, {size} B (per message)"),
                native,
                wasm,
            );
        }

        if wants("boundary-batch") {
            let mut worker = batch.worker(WorkerSettings::default());
            let (native, wasm) = compare(
                100,
                |n| {
                    per_message(n, msgs.len(), || {
                        black_box(
                            black_box(&msgs)
                                .iter()
                                .map(native_identity)
                                .collect::<Vec<_>>(),
                        )
                    })
                },
                |n| rt.block_on(wasm_batch(&mut worker, &msgs, n)),
            );
            row(
                &format!("wasm boundary, batch-handler, batch 64, {size} B (per message)"),
                native,
                wasm,
            );
        }
    }

    // The same batch with bare messages (no key, no headers): every string or
    // list in a message costs one `cabi_realloc` call into the guest to lower
    // and one host allocation to lift, so this row shows what the fields cost.
    if wants("boundary-bare") {
        let bare: Vec<Message> = (0..64)
            .map(|i| Message::new(format!("msg-{i:08}"), "bench.in", vec![b'x'; 128]))
            .collect();
        let mut worker = batch.worker(WorkerSettings::default());
        let (native, wasm) = compare(
            100,
            |n| {
                per_message(n, bare.len(), || {
                    black_box(
                        black_box(&bare)
                            .iter()
                            .map(native_identity)
                            .collect::<Vec<_>>(),
                    )
                })
            },
            |n| rt.block_on(wasm_batch(&mut worker, &bare, n)),
        );
        row(
            "wasm boundary, batch-handler, batch 64, 128 B, no key or headers (per message)",
            native,
            wasm,
        );
    }
}

async fn wasm_single(worker: &mut Worker, msg: &Message, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        black_box(
            worker
                .handle(black_box(msg))
                .await
                .expect("identity succeeds"),
        );
    }
    start.elapsed() / n as u32
}

async fn wasm_batch(worker: &mut Worker, msgs: &[Message], n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        let outcomes = worker.handle_batch(black_box(msgs)).await;
        assert!(outcomes.iter().all(Result::is_ok));
        black_box(outcomes);
    }
    start.elapsed() / (n * msgs.len()) as u32
}

/// Runs `f` `n` times, each handling `messages` messages; the time per message.
fn per_message<T>(n: usize, messages: usize, mut f: impl FnMut() -> T) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    start.elapsed() / (n * messages) as u32
}

fn epoch(rt: &tokio::runtime::Runtime) {
    let path = sluice_harness::plugin("crunch");
    let worker_for = |epoch_interruption: bool| {
        let host = PluginHost::new(HostConfig {
            epoch_interruption,
            max_instances: 4,
            max_memory: 64 << 20,
            ..HostConfig::default()
        })
        .expect("plugin host");
        let plugin = host.load(&path).expect("load crunch");
        let config = Arc::new(
            [("rounds".to_owned(), "2000".to_owned())]
                .into_iter()
                .collect(),
        );
        (
            host,
            plugin.worker(WorkerSettings {
                config,
                ..WorkerSettings::default()
            }),
        )
    };
    let (_off_host, mut off) = worker_for(false);
    let (_on_host, mut on) = worker_for(true);
    let msg = message(128, 0);
    let (without, with) = compare(
        20,
        |n| rt.block_on(wasm_single(&mut off, &msg, n)),
        |n| rt.block_on(wasm_single(&mut on, &msg, n)),
    );
    row(
        "epoch interruption, CPU-bound handler (2000 x 128 B hashes per call)",
        without,
        with,
    );
}

fn startup() {
    for name in ["uppercase", "router", "upper-batch"] {
        let path = sluice_harness::plugin(name);
        let cache = tempfile::tempdir().expect("tempdir");
        let host = |cached: bool| {
            PluginHost::new(HostConfig {
                cache_dir: cached.then(|| cache.path().to_owned()),
                max_instances: 4,
                max_memory: 64 << 20,
                ..HostConfig::default()
            })
            .expect("plugin host")
        };
        let (cold_host, warm_host) = (host(false), host(true));
        warm_host.load(&path).expect("prime the cache");
        let (warm, cold) = compare(
            1,
            |n| load(&warm_host, &path, n),
            |n| load(&cold_host, &path, n),
        );
        row(
            &format!("start-up, load `{name}` (warm = from cache, cold = compile)"),
            warm,
            cold,
        );
    }
}

fn load(host: &PluginHost, path: &Path, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        black_box(host.load(path).expect("load"));
    }
    start.elapsed() / n as u32
}

/// Alternates samples of `a` and `b` (after one warm-up each), `n`
/// iterations per sample; returns the median time per iteration of each.
fn compare(
    n: usize,
    mut a: impl FnMut(usize) -> Duration,
    mut b: impl FnMut(usize) -> Duration,
) -> (Duration, Duration) {
    a(n);
    b(n);
    let (mut xs, mut ys) = (Vec::with_capacity(SAMPLES), Vec::with_capacity(SAMPLES));
    for _ in 0..SAMPLES {
        xs.push(a(n));
        ys.push(b(n));
    }
    (median(xs), median(ys))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn row(name: &str, base: Duration, measured: Duration) {
    let overhead = measured.as_secs_f64() - base.as_secs_f64();
    println!(
        "| {name} | {} | {} | {} | {:.2}x |",
        human(base.as_secs_f64()),
        human(measured.as_secs_f64()),
        human(overhead),
        measured.as_secs_f64() / base.as_secs_f64()
    );
}

fn human(secs: f64) -> String {
    let abs = secs.abs();
    if abs >= 1.0 {
        format!("{secs:.2} s")
    } else if abs >= 1e-3 {
        format!("{:.2} ms", secs * 1e3)
    } else if abs >= 1e-6 {
        format!("{:.2} µs", secs * 1e6)
    } else {
        format!("{:.0} ns", secs * 1e9)
    }
}
