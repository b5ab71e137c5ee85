//! The memory limit bounds the host process, not just the guest's view:
//! while `membomb` grows its memory as fast as it can, the host's resident
//! set stays below the limit plus 50 MB. A test binary of its own, so no
//! other test's allocations share the process.

use std::time::Duration;

use sluice::FailureKind;
use sluice::plugin::{HostConfig, Limits, Message, PluginHost, WorkerSettings};

/// Reads a `kB` field of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a number of kB");
    kb * 1024
}

#[test]
fn host_rss_stays_below_the_limit_plus_50_mb() {
    const LIMIT: usize = 128 << 20;
    let path = sluice_harness::plugin("membomb");
    let host = PluginHost::new(HostConfig {
        max_memory: 1 << 30,
        max_instances: 4,
        ..HostConfig::default()
    })
    .expect("host");
    let plugin = host.load(&path).expect("load membomb");
    let settings = WorkerSettings {
        limits: Limits {
            memory: LIMIT,
            timeout: Duration::from_secs(30),
            ..Limits::default()
        },
        ..WorkerSettings::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // Reset the peak so it measures only the bombs (Linux: writing 5 to clear_refs resets VmHWM).
    std::fs::write("/proc/self/clear_refs", "5").expect("reset peak RSS");
    let baseline = status_bytes("VmRSS:");
    // Three in a row: a daemon meets the same poison message again and again,
    // and each discarded instance must give its memory back.
    let mut worker = plugin.worker(settings);
    for round in 1..=3 {
        let failure = rt
            .block_on(worker.handle(&Message::new(format!("{round}"), "t", Vec::new())))
            .expect_err("membomb fails");
        assert_eq!(
            failure.kind,
            FailureKind::OutOfMemory,
            "round {round}: {failure}"
        );
    }
    let peak = status_bytes("VmHWM:");
    let after = status_bytes("VmRSS:");

    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "baseline {baseline} B, peak {peak} B (grown {grown} B), after {after} B, limit {LIMIT} B"
    );
    assert!(
        grown > (LIMIT as u64) / 2,
        "the bomb really touched its memory (grew {grown} B)"
    );
    assert!(
        grown < LIMIT as u64 + 50_000_000,
        "host RSS grew {grown} B, more than the limit plus 50 MB"
    );
    assert!(
        after < baseline + 50_000_000,
        "discarded instances released their memory: {after} B resident after, {baseline} B before"
    );
}
