//! [`NatsCluster`]: several [`NatsServer`]s routed into one JetStream cluster.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{
    Clustering, NatsServer, POLL, START_ATTEMPTS, START_TIMEOUT, free_ports, nats_server_binary,
    unique_name,
};

/// A JetStream cluster of real nats-servers on loopback, for tests of
/// failover and reconnection: every node has its own client, route and
/// monitoring ports, store and `server_name`, and routes to all the others.
/// Dropping it kills every node and removes their stores.
#[derive(Debug)]
pub struct NatsCluster {
    /// The cluster's name, unique in this process.
    name: String,
    /// The nodes, in the order of [`urls`](Self::urls).
    nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts `size` nodes (at least 2; 3 keeps a JetStream quorum when one
    /// is lost) and waits until the cluster has formed (see
    /// [`wait_formed`](Self::wait_formed)).
    ///
    /// # Errors
    ///
    /// When `size` is below 2, the binary cannot be found (see
    /// [`nats_server_binary`](super::nats_server_binary)), a node exits, or
    /// the cluster has not formed within 30 s (the error quotes the log of a
    /// node that is not ready).
    pub fn start(size: usize) -> anyhow::Result<NatsCluster> {
        if size < 2 {
            bail!("a cluster needs at least 2 nodes, not {size}");
        }
        let binary = nats_server_binary()?;
        let mut attempt = 1;
        loop {
            // Per node: client, monitoring, route.
            let ports = free_ports(3 * size)?;
            let route_ports: Vec<u16> = ports.chunks(3).map(|p| p[2]).collect();
            let name = unique_name();
            let mut nodes = Vec::with_capacity(size);
            for (i, p) in ports.chunks(3).enumerate() {
                let clustering = Clustering {
                    name: name.clone(),
                    port: p[2],
                    peers: route_ports.iter().copied().filter(|&r| r != p[2]).collect(),
                };
                let node_name = format!("{name}-n{i}");
                nodes.push(NatsServer::create(
                    &binary,
                    node_name,
                    p[0],
                    p[1],
                    Some(clustering),
                    false,
                )?);
            }
            let mut cluster = NatsCluster { name, nodes };
            for node in &mut cluster.nodes {
                node.spawn()?;
            }
            match cluster.wait_formed(START_TIMEOUT) {
                Ok(()) => return Ok(cluster),
                Err(_)
                    if attempt < START_ATTEMPTS
                        && cluster.nodes.iter_mut().any(|n| n.lost_port_race()) =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until every running node is healthy (as
    /// [`NatsServer::start`] checks: JetStream on and current with its meta
    /// leader) and has routes to exactly the other running nodes, by
    /// `server_name` in `/routez`. After a node is killed this is how a test
    /// waits for the survivors to settle.
    ///
    /// # Errors
    ///
    /// When a node that should be running has exited, or the cluster has not
    /// formed within `timeout` (the error quotes the log of a node that is
    /// not ready).
    pub fn wait_formed(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            for node in &mut self.nodes {
                if let Some(status) = node.exited() {
                    bail!(node.failure(&format!("exited ({status}) while in the cluster")));
                }
            }
            let running: BTreeSet<&str> = self
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .map(NatsServer::name)
                .collect();
            let not_ready = self
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .find_map(|node| {
                    let mut peers = running.clone();
                    peers.remove(node.name());
                    let ready = node.probe().and_then(|()| {
                        let routes = node.routes().map_err(|e| format!("{e:#}"))?;
                        let routes: BTreeSet<&str> = routes.iter().map(String::as_str).collect();
                        if routes == peers {
                            Ok(())
                        } else {
                            Err(format!("routes to {routes:?}, expected {peers:?}"))
                        }
                    });
                    ready.err().map(|why| (node, why))
                });
            let Some((node, why)) = not_ready else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                bail!(node.failure(&format!(
                    "cluster {} has not formed in time ({}s); last check: {why}",
                    self.name,
                    timeout.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The nodes, to read their URLs, logs, routes and stores.
    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// The cluster name every node has in its `cluster` block.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every node's client URL, comma-joined: the seed list a client is
    /// given so that it can fail over to the others.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(NatsServer::url).collect();
        urls.join(",")
    }

    /// The node at `index`.
    fn node_mut(&mut self, index: usize) -> anyhow::Result<&mut NatsServer> {
        let size = self.nodes.len();
        self.nodes
            .get_mut(index)
            .with_context(|| format!("no node {index} in a cluster of {size}"))
    }

    /// Kills node `index` with SIGKILL, as in a crash (see
    /// [`NatsServer::kill`]); its ports and store stay for
    /// [`restart_node`](Self::restart_node).
    ///
    /// # Errors
    ///
    /// When there is no such node or it cannot be killed.
    pub fn kill_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.node_mut(index)?.kill()
    }

    /// Stops node `index` gracefully with SIGTERM (see [`NatsServer::stop`]).
    ///
    /// # Errors
    ///
    /// When there is no such node or it does not stop.
    pub fn stop_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.node_mut(index)?.stop()
    }

    /// Starts node `index` again on its old ports with its old store (see
    /// [`NatsServer::restart`]) and waits until the cluster has formed again
    /// (see [`wait_formed`](Self::wait_formed)). The node can only become
    /// healthy while a majority of the nodes is running.
    ///
    /// # Errors
    ///
    /// When there is no such node, or it or the cluster is not ready within
    /// 30 s.
    pub fn restart_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.node_mut(index)?.restart()?;
        self.wait_formed(START_TIMEOUT)
    }
}
