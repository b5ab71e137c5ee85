//! The nats-server harness against real nats-server 2.15 processes: a single
//! server starts, speaks NATS, survives a crash and a restart on its port, and
//! is gone after drop; a 3-node cluster forms and survives losing a node.
//!
//! Nothing is skipped: without the binary every test fails with the pip hint.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use sluice_harness::nats::{NatsCluster, NatsServer};

/// Generous: the checks below wait for events, never for a time.
const SETTLE: Duration = Duration::from_secs(60);

/// Connects to `port` and returns the `INFO {json}` line every NATS server
/// sends first, parsed.
fn info(port: u16) -> anyhow::Result<serde_json::Value> {
    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(SETTLE))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let json = line
        .strip_prefix("INFO ")
        .with_context(|| format!("the first line is not INFO: {line:?}"))?;
    serde_json::from_str(json.trim()).with_context(|| format!("bad INFO JSON: {json:?}"))
}

/// Whether a process with this pid exists (Linux).
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_server_starts_with_jetstream_on_its_own_port() -> anyhow::Result<()> {
    let server = NatsServer::start()?;
    ensure!(server.port() != 4222, "never the system server's port");
    assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));

    let info = info(server.port())?;
    assert_eq!(info["version"], "2.15.1", "{info}");
    assert_eq!(info["jetstream"], true, "{info}");
    assert_eq!(info["port"], server.port(), "{info}");
    assert_eq!(info["server_name"], server.name(), "{info}");

    let varz = server.monitor_json("/varz")?;
    assert_eq!(
        varz["jetstream"]["config"]["store_dir"],
        server
            .store_dir()
            .join("jetstream")
            .to_str()
            .context("path")?
    );
    assert!(server.store_dir().is_dir());
    assert!(server.log().contains("Server is ready"), "{}", server.log());
    Ok(())
}

#[test]
fn a_killed_server_restarts_on_the_same_port_with_the_same_store() -> anyhow::Result<()> {
    let mut server = NatsServer::start()?;
    let (port, store) = (server.port(), server.store_dir().to_path_buf());
    let first = info(port)?;

    server.kill()?;
    assert!(!server.is_running());
    // The process was reaped, so its listener is gone.
    ensure!(
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err(),
        "port {port} still accepts connections after SIGKILL"
    );

    server.restart()?;
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_eq!(server.store_dir(), store);
    let second = info(port)?;
    assert_eq!(second["version"], "2.15.1", "{second}");
    assert_eq!(second["jetstream"], true, "{second}");
    assert_ne!(first["server_id"], second["server_id"], "a new process");

    // A graceful stop and another restart work too.
    server.stop()?;
    server.restart()?;
    info(port)?;
    let runs = server.log().matches("=== sluice-harness: starting").count();
    // At least: a restart retries when its port is briefly taken.
    assert!(runs >= 3, "{}", server.log());
    Ok(())
}

#[test]
fn dropping_a_server_kills_it_and_removes_its_store() -> anyhow::Result<()> {
    let server = NatsServer::start()?;
    let pid = server.pid().context("running")?;
    let store = server.store_dir().to_path_buf();
    assert!(process_exists(pid) && store.is_dir());
    drop(server);
    assert!(
        !process_exists(pid),
        "nats-server {pid} outlived its handle"
    );
    assert!(!store.exists(), "{} was left behind", store.display());
    Ok(())
}

#[test]
fn a_panicking_test_still_kills_its_server() -> anyhow::Result<()> {
    let mut seen = None;
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = NatsServer::start().expect("the server starts");
        seen = Some((server.pid(), server.store_dir().to_path_buf()));
        panic!("a failing test");
    }));
    ensure!(panicked.is_err());
    let (pid, store) = seen.context("the server started")?;
    let pid = pid.context("running")?;
    assert!(!process_exists(pid), "nats-server {pid} outlived the panic");
    assert!(!store.exists(), "{} was left behind", store.display());
    Ok(())
}

#[test]
fn a_three_node_cluster_forms_and_survives_losing_a_node() -> anyhow::Result<()> {
    let mut cluster = NatsCluster::start(3)?;
    let names: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    assert_eq!(cluster.urls().split(',').count(), 3, "{}", cluster.urls());
    for node in cluster.nodes() {
        let mut others = names.clone();
        others.retain(|n| n != node.name());
        let routes: Vec<String> = node.routes()?.into_iter().collect();
        assert_eq!(routes, others, "routes of {}", node.name());
        let info = info(node.port())?;
        assert_eq!(info["cluster"], cluster.name(), "{info}");
        assert_eq!(info["jetstream"], true, "{info}");
        assert!(cluster.urls().contains(&node.url()));
    }

    // Lose node 0 (maybe the JetStream meta leader): the other two keep a
    // quorum, so they become healthy again with routes to each other only.
    cluster.kill_node(0)?;
    cluster.wait_formed(SETTLE)?;
    assert!(!cluster.nodes()[0].is_running());
    for node in &cluster.nodes()[1..] {
        let health = node.monitor_json("/healthz")?;
        assert_eq!(
            health["status"],
            "ok",
            "{} is unhealthy: {health}",
            node.name()
        );
        let routes = node.routes()?;
        assert_eq!(routes.len(), 1, "{}: {routes:?}", node.name());
        assert!(!routes.contains(&names[0]), "{}: {routes:?}", node.name());
        info(node.port())?;
    }

    // It comes back on its old ports and rejoins.
    cluster.restart_node(0)?;
    for node in cluster.nodes() {
        assert_eq!(node.routes()?.len(), 2, "routes of {}", node.name());
    }
    Ok(())
}
