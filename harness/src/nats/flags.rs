//! A nats-server started from command-line flags alone, for what the
//! config-file [`super::NatsServer`] does not cover: nats-server's default
//! sync (benchmarks) or authentication flags (`--user`/`--pass`,
//! `--auth`).

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A nats-server with JetStream on a free loopback port and a temporary
/// store, plus the caller's flags; killed and removed on drop.
pub struct FlagServer {
    child: Child,
    port: u16,
    _store: tempfile::TempDir,
}

impl FlagServer {
    /// Starts one with `flags` added (e.g. `["--user", "u", "--pass", "p"]`)
    /// and waits until it accepts connections.
    ///
    /// # Errors
    ///
    /// When the binary is missing or the server does not listen within 30 s.
    pub fn start(flags: &[&str]) -> anyhow::Result<FlagServer> {
        let store = tempfile::tempdir().context("a store directory")?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .context("a free port")?
            .port();
        let child = Command::new(super::nats_server_binary()?)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store.path())
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn nats-server")?;
        let mut server = FlagServer {
            child,
            port,
            _store: store,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if let Some(status) = server.child.try_wait()? {
                bail!("nats-server {flags:?} exited at start: {status}");
            }
            if Instant::now() > deadline {
                bail!("nats-server {flags:?} did not listen on {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for FlagServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
