//! The plugin host against real plugins built from `plugins/`: the examples,
//! the adversarial testkit, bad plugin files and the compile cache.

use std::time::{Duration, Instant};

use sluice::FailureKind;
use sluice::plugin::{
    CacheStatus, Capability, Contract, GuestSecrets, HostConfig, Isolation, Limits, Message,
    Outputs, PluginHost, WorkerSettings, World,
};
use sluice_tests::plugins::{HOST, msg, plugin, settings};

/// After an adversarial call, the same host must still serve a normal one.
async fn host_still_serves() {
    let emits = plugin("uppercase")
        .worker(settings(&[]))
        .handle(&msg("still alive"))
        .await
        .expect("a normal call succeeds");
    assert_eq!(emits[0].payload, b"STILL ALIVE");
}

#[tokio::test]
async fn uppercase_upper_cases_and_keeps_key_and_headers() {
    let uppercase = plugin("uppercase");
    assert_eq!(uppercase.world(), World::Handler);
    let mut message = msg("hello");
    message.key = Some("k1".into());
    message.headers = vec![("trace".into(), "abc".into())];
    let emits = uppercase
        .worker(settings(&[]))
        .handle(&message)
        .await
        .expect("uppercase succeeds");
    assert_eq!(emits.len(), 1);
    assert_eq!(emits[0].payload, b"HELLO");
    assert_eq!(
        emits[0].topic, "out",
        "the default output is resolved by the host"
    );
    assert_eq!(emits[0].key.as_deref(), Some("k1"));
    assert_eq!(
        emits[0].headers,
        vec![("trace".to_string(), "abc".to_string())]
    );
}

#[tokio::test]
async fn router_sends_each_field_value_to_its_own_topic() {
    let router = plugin("router");
    let mut worker = router.worker(settings(&[
        ("route.eu", "orders.eu"),
        ("route.us", "orders.us"),
    ]));
    for (payload, topic) in [
        (r#"{"type":"eu","n":1}"#, "orders.eu"),
        (r#"{"type":"us","n":2}"#, "orders.us"),
        (r#"{"type":"eu","n":3}"#, "orders.eu"),
    ] {
        let emits = worker
            .handle(&msg(payload))
            .await
            .expect("routing succeeds");
        assert_eq!(emits.len(), 1);
        assert_eq!(emits[0].topic, topic, "payload {payload}");
        assert_eq!(
            emits[0].payload,
            payload.as_bytes(),
            "the payload is forwarded unchanged"
        );
    }
    // Without a route, the value itself (plus a prefix) is the topic.
    let mut worker = router.worker(settings(&[
        ("field", "region"),
        ("topic_prefix", "by-region."),
    ]));
    let emits = worker
        .handle(&msg(r#"{"region":"apac"}"#))
        .await
        .expect("routing by prefix succeeds");
    assert_eq!(emits[0].topic, "by-region.apac");
}

#[tokio::test]
async fn router_rejects_what_it_cannot_route() {
    let mut worker = plugin("router").worker(settings(&[]));
    let failure = worker
        .handle(&msg("not json {"))
        .await
        .expect_err("non-JSON is rejected");
    assert_eq!(failure.kind, FailureKind::Rejected);
    assert!(
        failure.message.to_lowercase().contains("json"),
        "reason names the problem: {}",
        failure.message
    );
    let failure = worker
        .handle(&msg(r#"{"other":1}"#))
        .await
        .expect_err("a missing field is rejected");
    assert_eq!(failure.kind, FailureKind::Rejected);
    assert!(
        failure.message.contains("type"),
        "reason names the field: {}",
        failure.message
    );
}

#[tokio::test]
async fn emitting_to_an_undeclared_topic_is_classified() {
    let mut settings = settings(&[]);
    settings.outputs = Outputs::Declared(vec!["a".into()]);
    let failure = plugin("router")
        .worker(settings)
        .handle(&msg(r#"{"type":"b"}"#))
        .await
        .expect_err("b is not declared");
    assert_eq!(failure.kind, FailureKind::UndeclaredTopic);
    assert!(
        failure.message.contains("`b`") && failure.message.contains("declared: a"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn batch_handler_gets_one_outcome_per_item() {
    let batch = plugin("upper-batch");
    assert_eq!(batch.world(), World::BatchHandler);
    let mut worker = batch.worker(settings(&[]));
    let outcomes = worker.handle_batch(&[msg("a"), msg(""), msg("c")]).await;
    assert_eq!(outcomes.len(), 3);
    assert_eq!(
        outcomes[0].as_ref().expect("item 0 succeeds")[0].payload,
        b"A"
    );
    assert_eq!(
        outcomes[1].as_ref().expect_err("item 1 is rejected").kind,
        FailureKind::Rejected
    );
    assert_eq!(
        outcomes[2].as_ref().expect("item 2 succeeds")[0].payload,
        b"C"
    );
    // A single message through a batch plugin is a batch of one.
    assert_eq!(
        worker
            .handle(&msg("z"))
            .await
            .expect("single call succeeds")[0]
            .payload,
        b"Z"
    );
}

#[tokio::test]
async fn fail_plugin_retries_or_rejects_as_configured() {
    let fail = plugin("fail");
    let failure = fail
        .worker(settings(&[("retry_after_ms", "250")]))
        .handle(&msg("x"))
        .await
        .expect_err("retry");
    assert_eq!(failure.kind, FailureKind::Retry);
    assert_eq!(failure.retry_after, Some(Duration::from_millis(250)));
    let failure = fail
        .worker(settings(&[("mode", "reject"), ("reason", "bad order")]))
        .handle(&msg("x"))
        .await
        .expect_err("reject");
    assert_eq!(failure.kind, FailureKind::Rejected);
    assert_eq!(failure.message, "bad order");

    // A fraction fails, chosen by message id, so the same id always behaves the same.
    let mut worker = fail.worker(settings(&[("mode", "reject"), ("fraction", "0.3")]));
    let mut failed = 0;
    for i in 0..200 {
        let message = Message::new(format!("order-{i}"), "in", b"x".to_vec());
        let first = worker.handle(&message).await.is_err();
        let again = worker.handle(&message).await.is_err();
        assert_eq!(first, again, "the choice is deterministic per id");
        failed += usize::from(first);
    }
    assert!(
        (30..=90).contains(&failed),
        "about 30% of 200 fail, got {failed}"
    );
}

#[tokio::test]
async fn spin_times_out_promptly_and_the_host_recovers() {
    let timeout = Duration::from_millis(300);
    let mut settings = settings(&[]);
    settings.limits.timeout = timeout;
    let mut worker = plugin("spin").worker(settings);
    let started = Instant::now();
    let failure = worker
        .handle(&msg("x"))
        .await
        .expect_err("spin never returns");
    let elapsed = started.elapsed();
    assert_eq!(failure.kind, FailureKind::Timeout, "{failure}");
    assert!(elapsed >= timeout, "not before the timeout: {elapsed:?}");
    // Promptly: the epoch deadline stops the guest, not some far later
    // limit. The margin is generous because the machine may be loaded.
    assert!(
        elapsed < timeout + Duration::from_secs(5),
        "within the timeout and a few seconds: {elapsed:?}"
    );
    // The trapped instance was discarded: the next call starts a new one (and times out again).
    assert_eq!(
        worker
            .handle(&msg("x"))
            .await
            .expect_err("still spins")
            .kind,
        FailureKind::Timeout
    );
    assert_eq!(worker.instantiations(), 2);
    host_still_serves().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_busy_handler_does_not_stall_other_tasks() {
    // One runtime thread: if the handler held it, the ticker below could not run.
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let mut settings = settings(&[]);
    settings.limits.timeout = Duration::from_millis(500);
    let failure = plugin("spin")
        .worker(settings)
        .handle(&msg("x"))
        .await
        .expect_err("spin times out");
    assert_eq!(failure.kind, FailureKind::Timeout);
    let seen = ticks.load(std::sync::atomic::Ordering::Relaxed);
    ticker.abort();
    // The count is read right after the call returns, before this task
    // yields, so a handler that held the only runtime thread would leave it
    // at exactly 0. A few ticks prove interleaving, however loaded the machine.
    assert!(
        seen >= 3,
        "other tasks kept running while the handler spun: {seen} ticks"
    );
}

#[tokio::test]
async fn membomb_hits_the_memory_limit_and_the_host_recovers() {
    let mut settings = settings(&[]);
    settings.limits.memory = 64 << 20;
    let failure = plugin("membomb")
        .worker(settings)
        .handle(&msg("x"))
        .await
        .expect_err("membomb runs out");
    assert_eq!(failure.kind, FailureKind::OutOfMemory, "{failure}");
    assert!(
        failure.message.contains(&(64u64 << 20).to_string()),
        "names the limit: {}",
        failure.message
    );
    host_still_serves().await;
}

#[tokio::test]
async fn stackbomb_traps_and_the_host_recovers() {
    let failure = plugin("stackbomb")
        .worker(settings(&[]))
        .handle(&msg("x"))
        .await
        .expect_err("stack overflows");
    // Rust keeps its stack in linear memory, so the overflow surfaces as an
    // out-of-bounds access or a native stack exhaustion; either is a trap.
    assert_eq!(failure.kind, FailureKind::Trap, "{failure}");
    host_still_serves().await;
}

#[tokio::test]
async fn bigout_exceeds_the_output_caps_and_the_host_recovers() {
    let mut by_bytes = settings(&[("mode", "bytes"), ("bytes", "2000000")]);
    by_bytes.limits.max_output_bytes = 1_000_000;
    let failure = plugin("bigout")
        .worker(by_bytes)
        .handle(&msg("x"))
        .await
        .expect_err("too many bytes");
    assert_eq!(failure.kind, FailureKind::OutputTooLarge, "{failure}");
    assert!(
        failure.message.contains("1000000"),
        "names the cap: {}",
        failure.message
    );

    let mut by_count = settings(&[("mode", "count"), ("count", "5000")]);
    by_count.limits.max_emits = 1000;
    let failure = plugin("bigout")
        .worker(by_count)
        .handle(&msg("x"))
        .await
        .expect_err("too many emits");
    assert_eq!(failure.kind, FailureKind::OutputTooLarge, "{failure}");
    assert!(
        failure.message.contains("5000") && failure.message.contains("1000"),
        "{}",
        failure.message
    );
    host_still_serves().await;
}

#[tokio::test]
async fn escape_is_denied_every_capability() {
    let emits = plugin("escape")
        .worker(settings(&[]))
        .handle(&msg("x"))
        .await
        .expect("escape reports");
    let report: serde_json::Value =
        serde_json::from_slice(&emits[0].payload).expect("escape emits JSON");
    let attempts = report.as_object().expect("an object of attempts");
    for name in [
        "read_file",
        "list_dir",
        "env_var",
        "env_count",
        "args",
        "tcp_connect",
        "dns",
    ] {
        let attempt = &attempts[name];
        assert_eq!(attempt["ok"], false, "{name} must be denied, got {attempt}");
    }
}

#[tokio::test]
async fn instances_are_reused_until_a_failure_or_by_policy() {
    let identity = plugin("identity");
    let mut worker = identity.worker(settings(&[]));
    for i in 0..5 {
        worker
            .handle(&msg(&i.to_string()))
            .await
            .expect("identity succeeds");
    }
    assert_eq!(worker.instantiations(), 1, "one instance serves every call");

    let mut isolated = identity.worker(WorkerSettings {
        isolation: Isolation::PerMessage,
        ..settings(&[])
    });
    for i in 0..3 {
        isolated
            .handle(&msg(&i.to_string()))
            .await
            .expect("identity succeeds");
    }
    assert_eq!(
        isolated.instantiations(),
        3,
        "per-message isolation creates an instance per call"
    );
}

#[tokio::test]
async fn sleepy_busy_works_for_the_configured_time() {
    let started = Instant::now();
    let emits = plugin("sleepy")
        .worker(settings(&[("ms", "120")]))
        .handle(&msg("zz"))
        .await
        .expect("sleepy succeeds");
    assert!(started.elapsed() >= Duration::from_millis(120));
    assert_eq!(emits[0].payload, b"zz");
    let mut short = settings(&[("ms", "2000")]);
    short.limits.timeout = Duration::from_millis(200);
    let failure = plugin("sleepy")
        .worker(short)
        .handle(&msg("zz"))
        .await
        .expect_err("too slow");
    assert_eq!(failure.kind, FailureKind::Timeout);
}

fn load_error(path: &std::path::Path) -> String {
    HOST.load(path)
        .expect_err("the file is refused")
        .to_string()
}

#[test]
fn bad_plugin_files_get_one_clear_error_each() {
    let dir = tempfile::tempdir().expect("tempdir");

    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "just some text").expect("write");
    let err = load_error(&text);
    assert!(
        err.contains("notes.wasm")
            && err.contains("not a WebAssembly file")
            && err.contains("component"),
        "{err}"
    );

    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("write");
    let err = load_error(&core);
    assert!(
        err.contains("core.wasm")
            && err.contains("core WebAssembly module")
            && err.contains("wasm32-wasip2"),
        "{err}"
    );

    let other_world = sluice_harness::plugin("notahandler");
    let err = load_error(&other_world);
    assert!(
        err.contains("notahandler.wasm") && err.contains("not a Sluice plugin"),
        "{err}"
    );
    assert!(
        err.contains("wasi:cli/run") && err.contains("sluice:plugin/message-handler@0.1.0"),
        "says what it has and what was expected: {err}"
    );

    let future = sluice_harness::plugin("future-version");
    let err = load_error(&future);
    // Its imports are read first: `sluice:plugin/types@0.9.0` names the
    // contract version it was built against.
    assert!(
        err.contains("future-version.wasm") && err.contains("sluice:plugin@0.9.0"),
        "{err}"
    );
    assert!(
        err.contains("implements sluice:plugin@0.1.0 and @0.2.0") && err.contains("rebuild"),
        "{err}"
    );

    let missing = dir.path().join("missing.wasm");
    let err = load_error(&missing);
    assert!(
        err.contains("missing.wasm") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn compiled_components_are_cached_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || HostConfig {
        cache_dir: Some(dir.path().join("cache")),
        max_instances: 4,
        max_memory: 64 << 20,
        ..HostConfig::default()
    };
    let path = sluice_harness::plugin("uppercase");

    let first = PluginHost::new(config()).expect("host");
    assert_eq!(
        first.load(&path).expect("load").cache_status(),
        CacheStatus::Miss
    );
    assert_eq!(
        first.load(&path).expect("load").cache_status(),
        CacheStatus::Hit
    );

    // A restarted host (new engine) loads from the cache without compiling.
    let restarted = PluginHost::new(config()).expect("host");
    assert_eq!(
        restarted.load(&path).expect("load").cache_status(),
        CacheStatus::Hit
    );

    // A damaged entry is detected, recompiled and replaced.
    let entry = std::fs::read_dir(dir.path().join("cache"))
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("an entry");
    let mut bytes = std::fs::read(&entry).expect("read entry");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&entry, bytes).expect("corrupt entry");
    let plugin = restarted.load(&path).expect("load despite corruption");
    assert_eq!(plugin.cache_status(), CacheStatus::Miss);
    assert_eq!(
        restarted.load(&path).expect("load").cache_status(),
        CacheStatus::Hit
    );

    // And the recompiled plugin works.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let emits = rt.block_on(
        plugin
            .worker(WorkerSettings {
                limits: Limits {
                    memory: 32 << 20,
                    ..Limits::default()
                },
                ..WorkerSettings::default()
            })
            .handle(&Message::new("1", "t", b"abc".to_vec())),
    );
    assert_eq!(emits.expect("works")[0].payload, b"ABC");
}

#[tokio::test]
async fn a_panic_is_a_trap_that_carries_the_guest_message() {
    let mut worker = plugin("chatty").worker(settings(&[("panic", "the ledger is on fire")]));
    let failure = worker.handle(&msg("x")).await.expect_err("chatty panics");
    assert_eq!(failure.kind, FailureKind::Trap, "{failure}");
    assert!(
        failure.message.contains("the ledger is on fire"),
        "the panic message is in the failure: {}",
        failure.message
    );
    assert!(
        !failure.message.contains("RUST_BACKTRACE"),
        "{}",
        failure.message
    );
    host_still_serves().await;
}

/// The worker's future must be `Send` so the engine can spawn it on a
/// multi-threaded runtime.
#[test]
fn worker_calls_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let mut worker = plugin("identity").worker(settings(&[]));
    let message = msg("x");
    let call = worker.handle(&message);
    assert_send(&call);
}

#[tokio::test]
async fn a_batch_with_the_wrong_number_of_outcomes_fails_whole() {
    let mut worker = plugin("short-batch").worker(settings(&[]));
    let outcomes = worker.handle_batch(&[msg("a"), msg("b"), msg("c")]).await;
    assert_eq!(outcomes.len(), 3, "still one outcome per message");
    for outcome in &outcomes {
        let failure = outcome.as_ref().expect_err("no item can be trusted");
        assert_eq!(failure.kind, FailureKind::Trap);
        assert!(
            failure.message.contains("2 outcomes for 3 messages"),
            "{}",
            failure.message
        );
    }
    host_still_serves().await;
}

#[tokio::test]
async fn in_a_batch_for_a_handler_plugin_a_trap_fails_only_its_own_message() {
    let mut worker = plugin("chatty").worker(settings(&[
        ("lines", "0"),
        ("panic", "poison"),
        ("panic_if_payload", "bad"),
    ]));
    let outcomes = worker.handle_batch(&[msg("a"), msg("bad"), msg("c")]).await;
    assert_eq!(
        outcomes[0].as_ref().expect("before the poison")[0].payload,
        b"a"
    );
    assert_eq!(
        outcomes[1].as_ref().expect_err("the poison").kind,
        FailureKind::Trap
    );
    assert_eq!(
        outcomes[2]
            .as_ref()
            .expect("after the poison, on a new instance")[0]
            .payload,
        b"c"
    );
    assert_eq!(
        worker.instantiations(),
        2,
        "the trapped instance was replaced"
    );
}

#[cfg(unix)]
#[test]
fn a_shared_cache_directory_is_made_private_before_use() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let host = PluginHost::new(HostConfig {
        cache_dir: Some(cache.clone()),
        max_instances: 4,
        max_memory: 64 << 20,
        ..HostConfig::default()
    })
    .expect("host");
    assert!(host.caches_compiled_plugins());
    let mode = std::fs::metadata(&cache)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "others can no longer plant entries");
}

/// A component built for contract 0.1.0 before 0.2.0 existed (the
/// examples' bytes as the Rust SDK built them then, kept in
/// `tests/fixtures/contract-0.1/`) loads and runs unchanged, in both
/// worlds.
#[tokio::test]
async fn components_built_for_0_1_0_run_unchanged() {
    let fixtures = sluice_harness::repo_root().join("tests/fixtures/contract-0.1");
    let single = HOST
        .load(fixtures.join("uppercase.wasm"))
        .expect("a 0.1.0 handler loads");
    assert_eq!(single.contract(), Contract::V0_1);
    assert_eq!(single.world(), World::Handler);
    single
        .check_grants("shout", &[])
        .expect("0.1.0 imports no capability");
    let emits = single
        .worker(settings(&[]))
        .handle(&msg("old bytes"))
        .await
        .expect("it runs");
    assert_eq!(emits[0].payload, b"OLD BYTES");

    let batch = HOST
        .load(fixtures.join("upper-batch.wasm"))
        .expect("a 0.1.0 batch handler loads");
    assert_eq!(
        (batch.contract(), batch.world()),
        (Contract::V0_1, World::BatchHandler)
    );
    let outcomes = batch
        .worker(settings(&[]))
        .handle_batch(&[msg("a"), msg("b")])
        .await;
    let payloads: Vec<Vec<u8>> = outcomes
        .into_iter()
        .map(|o| o.expect("ok").remove(0).payload)
        .collect();
    assert_eq!(payloads, vec![b"A".to_vec(), b"B".to_vec()]);
}

/// Worker settings whose stage `reader` grants the secret `token`.
fn granted(value: &str) -> WorkerSettings {
    WorkerSettings {
        secrets: GuestSecrets::new(
            "reader",
            std::collections::BTreeMap::from([("token".to_owned(), value.to_owned())]),
        ),
        ..settings(&[])
    }
}

/// A 0.2.0 handler that imports `sluice:plugin/secrets` is refused for a
/// stage that grants no secret, and on one that does it reads the value;
/// a name the stage does not list is an error it sees, naming the fix.
#[tokio::test]
async fn a_secret_is_read_only_where_the_stage_grants_it() {
    let reader = plugin("secret-reader");
    assert_eq!(reader.contract(), Contract::V0_2);
    let refused = reader
        .check_grants("reader", &[])
        .expect_err("no grant, no load")
        .to_string();
    assert!(
        refused.contains("sluice:plugin/secrets@0.2.0")
            && refused.contains("stage `reader` does not grant")
            && refused.contains("`secrets:`"),
        "{refused}"
    );
    reader
        .check_grants("reader", &[Capability::Secrets])
        .expect("granted");

    let mut worker = reader.worker(granted("s3cr3t-v4lue"));
    let emits = worker.handle(&msg("emit")).await.expect("read");
    assert_eq!(
        emits[0].payload, b"s3cr3t-v4lue",
        "an emit is the handler's data"
    );
    let other = worker.handle(&msg("other")).await.expect_err("not listed");
    assert_eq!(other.kind, FailureKind::Rejected);
    assert!(
        other.message.contains("does not list the secret `other`")
            && other.message.contains("it lists: token"),
        "{}",
        other.message
    );
}

/// A granted value never leaves through the handler's failure reasons:
/// a reject's reason and a trap's message and stderr are redacted (they
/// become dead letters' `sluice-dlq-error`).
#[tokio::test]
async fn a_secret_value_is_redacted_from_rejects_and_traps() {
    let value = "s3cr3t-v4lue";
    let mut worker = plugin("secret-reader").worker(granted(value));
    let rejected = worker.handle(&msg("reject")).await.expect_err("rejects");
    assert_eq!(rejected.kind, FailureKind::Rejected);
    assert_eq!(rejected.message, "refused with [secret token]");
    let trapped = worker.handle(&msg("trap")).await.expect_err("traps");
    assert_eq!(trapped.kind, FailureKind::Trap);
    assert!(
        !trapped.message.contains(value) && trapped.message.contains("[secret token]"),
        "{}",
        trapped.message
    );
    let logged = worker.handle(&msg("log")).await.expect("logs");
    assert_eq!(logged[0].payload, b"logged");
}
