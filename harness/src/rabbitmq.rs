//! Real RabbitMQ nodes for end-to-end tests: [`RabbitNode`] runs a
//! private `rabbitmq-server` node of the test's own (its own node name,
//! AMQP and distribution ports, data, log, config and plugin files in a
//! temporary directory, an Erlang cookie of its own), waits until
//! `rabbitmqctl await_startup` says it runs, and kills it on drop, even
//! when the test panicked.
//!
//! The scripts are Debian's (`/usr/lib/rabbitmq/bin`, package
//! `rabbitmq-server`), or the directory in `$SLUICE_RABBITMQ_BIN`. A
//! missing install is an error that says how to install it, never a
//! skipped test; the machine's own RabbitMQ (port 5672) is never used.
//! A node takes about 5 s to start on the 2-core CI machine (measured
//! with RabbitMQ 3.10), so tests share one node where they can.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use sluice_harness::rabbitmq::RabbitNode;
//!
//! let mut node = RabbitNode::start()?;
//! let url = node.url(); // amqp://guest:guest@127.0.0.1:<free port>/%2f
//! node.ctl(&["list_queues"])?;
//! node.restart()?; // durable queues and persistent messages survive
//! # Ok(()) }
//! ```

use crate::process::free_port;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a node may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

/// A running RabbitMQ node of this test's own.
pub struct RabbitNode {
    child: Option<Child>,
    port: u16,
    tls_port: Option<u16>,
    dist_port: u16,
    dir: tempfile::TempDir,
    node: String,
    /// How long the last start took.
    started_in: Duration,
}

impl RabbitNode {
    /// Starts a node on free loopback ports with an empty plugin list, in
    /// a fresh temporary directory, and waits until it runs.
    ///
    /// # Errors
    ///
    /// When the scripts cannot be found or run, or the node does not
    /// start in time (the error quotes its log).
    pub fn start() -> anyhow::Result<RabbitNode> {
        RabbitNode::start_with(None)
    }

    /// [`start`](Self::start), a node that also listens for TLS on a
    /// second port ([`tls_url`](Self::tls_url)) with this certificate and
    /// key (PEM); the first port stays plain, for outside clients.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_tls(cert: &str, key: &str) -> anyhow::Result<RabbitNode> {
        RabbitNode::start_with(Some((cert, key)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> anyhow::Result<RabbitNode> {
        let dir = tempfile::tempdir().context("a temporary directory for rabbitmq")?;
        let port = free_port()?;
        let dist_port = free_port()?;
        std::fs::create_dir_all(dir.path().join("mnesia"))?;
        std::fs::create_dir_all(dir.path().join("log"))?;
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n")?;
        let mut conf = String::from(
            "loopback_users = none\n\
             disk_free_limit.absolute = 50MB\n\
             log.console = false\n\
             log.file.level = info\n",
        );
        let mut tls_port = None;
        if let Some((cert, key)) = tls {
            let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert_file, cert)?;
            std::fs::write(&key_file, key)?;
            let port = free_port()?;
            conf.push_str(&format!(
                "listeners.ssl.1 = 127.0.0.1:{port}\n\
                 ssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\n\
                 ssl_options.fail_if_no_peer_cert = false\n",
                cert_file.display(),
                key_file.display()
            ));
            tls_port = Some(port);
        }
        std::fs::write(dir.path().join("rabbitmq.conf"), conf)?;
        let mut node = RabbitNode {
            child: None,
            port,
            tls_port,
            dist_port,
            node: format!("sluice-{port}@localhost"),
            dir,
            started_in: Duration::ZERO,
        };
        node.spawn()?;
        Ok(node)
    }

    /// The directory of the scripts: `$SLUICE_RABBITMQ_BIN`, else
    /// `/usr/lib/rabbitmq/bin`.
    fn bin() -> PathBuf {
        std::env::var_os("SLUICE_RABBITMQ_BIN")
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from("/usr/lib/rabbitmq/bin"), PathBuf::from)
    }

    /// A command of `script` with this node's environment.
    fn command(&self, script: &str) -> Command {
        let dir = self.dir.path();
        let mut cmd = Command::new(Self::bin().join(script));
        cmd.env("HOME", dir)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_PID_FILE", dir.join("pid"))
            .stdin(Stdio::null());
        cmd
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let out = std::fs::File::create(self.dir.path().join("server.out"))?;
        let child = self
            .command("rabbitmq-server")
            .stdout(out.try_clone()?)
            .stderr(out)
            // Its own process group: the script starts the VM (and maybe
            // epmd) as children, and drop kills them all.
            .process_group(0)
            .spawn()
            .with_context(|| {
                format!(
                    "could not run `{}`; install RabbitMQ (`apt-get install rabbitmq-server`) or \
                     set $SLUICE_RABBITMQ_BIN",
                    Self::bin().join("rabbitmq-server").display()
                )
            })?;
        self.child = Some(child);
        loop {
            let ready = self
                .command("rabbitmqctl")
                .args(["-n", &self.node, "await_startup", "--timeout", "30"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                self.started_in = started.elapsed();
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "rabbitmq-server exited ({status}) on port {}; log:\n{}",
                    self.port,
                    self.log()
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "rabbitmq node {} did not start within {START_TIMEOUT:?}; log:\n{}",
                    self.node,
                    self.log()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `amqps://guest:guest@localhost:PORT/%2f` of the TLS listener, for
    /// a node started with [`start_with_tls`](Self::start_with_tls)
    /// (`localhost`, a name the test certificates carry).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("amqps://guest:guest@localhost:{port}/%2f"))
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's name (`sluice-<port>@localhost`).
    pub fn name(&self) -> &str {
        &self.node
    }

    /// How long the last start (or restart) took, until `await_startup`.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Runs `rabbitmqctl -n NODE <args>` and returns its standard output.
    ///
    /// # Errors
    ///
    /// When it fails (the error quotes its output).
    pub fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command("rabbitmqctl")
            .args(["-n", &self.node, "-q"])
            .args(args)
            .output()
            .context("running rabbitmqctl")?;
        if !out.status.success() {
            bail!(
                "rabbitmqctl {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops the node (`rabbitmqctl stop`): durable queues and persistent
    /// messages stay in its directory. Connections are refused until
    /// [`start_again`](Self::start_again).
    pub fn stop(&mut self) {
        let _ = self.ctl(&["stop"]);
        if let Some(mut child) = self.child.take()
            && !crate::process::wait_exit(&mut child, Duration::from_secs(30))
        {
            kill_group(&mut child);
        }
    }

    /// Starts a stopped node again, on the same ports and data.
    ///
    /// # Errors
    ///
    /// When it does not start in time.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("the node is still running");
        }
        self.spawn()
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again).
    ///
    /// # Errors
    ///
    /// When it does not start again in time.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn()
    }

    /// The node's log so far (and what its script printed).
    pub fn log(&self) -> String {
        let mut text = read(&self.dir.path().join("server.out"));
        text.push_str(&read(
            &self
                .dir
                .path()
                .join("log")
                .join(format!("{}.log", self.node)),
        ));
        text
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

/// SIGKILL to the child's process group (the script and the VM), then reap.
fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
