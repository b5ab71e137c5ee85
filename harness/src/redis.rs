//! Real `redis-server` processes for end-to-end tests: [`RedisServer`]
//! runs one on a free loopback port with its own temporary directory and
//! no persistence of its own, answers `PING` before it is handed out, and
//! is killed on drop, even when the test panicked.
//!
//! The binary is `redis-server` from `$PATH` (Debian's `redis-server`
//! package), or `$SLUICE_REDIS_SERVER`. A missing binary is an error that
//! says how to install it, never a skipped test; a server already running
//! on the machine (on port 6379) is never used.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use sluice_harness::redis::RedisServer;
//!
//! let mut server = RedisServer::start()?;
//! let url = server.url(); // redis://127.0.0.1:<free port>/0
//! server.restart()?; // saves, stops, starts again on the same port with the same data
//! # Ok(()) }
//! ```

use crate::process::free_port;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `SHUTDOWN` may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// A running `redis-server` of this test's own.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    password: Option<String>,
    /// The TLS port, beside the plain one, when started with TLS.
    tls_port: Option<u16>,
}

impl RedisServer {
    /// Starts a server on a free port, with `--save '' --appendonly no` in
    /// a fresh temporary directory, and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// When `redis-server` cannot be found or run, or does not answer in
    /// time (the error quotes its log).
    pub fn start() -> anyhow::Result<RedisServer> {
        RedisServer::start_with_password(None)
    }

    /// [`start`](Self::start) with `--requirepass <password>` when given.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_password(password: Option<&str>) -> anyhow::Result<RedisServer> {
        let dir = tempfile::tempdir().context("a temporary directory for redis-server")?;
        let port = free_port()?;
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            password: password.map(str::to_owned),
            tls_port: None,
        };
        server.spawn()?;
        Ok(server)
    }

    /// [`start`](Self::start) with TLS too: a second port (`--tls-port`)
    /// serves TLS with this certificate and key (PEM), clients not asked
    /// for certificates. The plain port stays, for [`command`](Self::command)
    /// and readiness. [`tls_url`](Self::tls_url) is the TLS address.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); also when the files cannot be written.
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> anyhow::Result<RedisServer> {
        RedisServer::start_tls(cert_pem, key_pem, None)
    }

    /// [`start_with_tls`](Self::start_with_tls), and the TLS port accepts
    /// only clients whose certificate `client_ca_pem` vouches for (a
    /// self-signed client certificate can be its own CA).
    ///
    /// # Errors
    ///
    /// As [`start_with_tls`](Self::start_with_tls).
    pub fn start_with_client_auth(
        cert_pem: &str,
        key_pem: &str,
        client_ca_pem: &str,
    ) -> anyhow::Result<RedisServer> {
        RedisServer::start_tls(cert_pem, key_pem, Some(client_ca_pem))
    }

    fn start_tls(
        cert_pem: &str,
        key_pem: &str,
        client_ca_pem: Option<&str>,
    ) -> anyhow::Result<RedisServer> {
        let dir = tempfile::tempdir().context("a temporary directory for redis-server")?;
        std::fs::write(dir.path().join("tls.crt"), cert_pem)?;
        std::fs::write(dir.path().join("tls.key"), key_pem)?;
        if let Some(ca) = client_ca_pem {
            std::fs::write(dir.path().join("client-ca.crt"), ca)?;
        }
        let mut server = RedisServer {
            child: None,
            port: free_port()?,
            dir,
            password: None,
            tls_port: Some(free_port()?),
        };
        server.spawn()?;
        Ok(server)
    }

    /// `rediss://localhost:TLS_PORT/0`, when started with TLS.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://localhost:{port}/0"))
    }

    /// The binary: `$SLUICE_REDIS_SERVER`, else `redis-server` on `$PATH`.
    fn binary() -> PathBuf {
        std::env::var_os("SLUICE_REDIS_SERVER")
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(Self::binary());
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log);
        if let Some(password) = &self.password {
            cmd.args(["--requirepass", password]);
        }
        if let Some(tls_port) = self.tls_port {
            let crt = self.dir.path().join("tls.crt");
            let client_ca = self.dir.path().join("client-ca.crt");
            let (ca, auth) = if client_ca.is_file() {
                (client_ca, "yes")
            } else {
                (crt.clone(), "no")
            };
            cmd.args(["--tls-port", &tls_port.to_string()])
                .arg("--tls-cert-file")
                .arg(&crt)
                .arg("--tls-key-file")
                .arg(self.dir.path().join("tls.key"))
                .arg("--tls-ca-cert-file")
                .arg(&ca)
                .args(["--tls-auth-clients", auth]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "could not run `{}`; install it (`apt-get install redis-server`) or set \
                     $SLUICE_REDIS_SERVER",
                    Self::binary().display()
                )
            })?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(reply) = self.command(&["PING"])
                && reply.starts_with("+PONG")
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "redis-server exited ({status}) on port {}; log:\n{}",
                    self.port,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "redis-server did not answer PING on port {} within {START_TIMEOUT:?}; log:\n{}",
                    self.port,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// `redis://127.0.0.1:PORT/0` (with the password, if any).
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}/0", self.port),
            None => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends one command (authenticating first if there is a password)
    /// and returns the first line of the reply as RESP text (`+OK`,
    /// `:3`, `-ERR ...`).
    ///
    /// # Errors
    ///
    /// When the server cannot be reached.
    pub fn command(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut packed = Vec::new();
        if let Some(password) = &self.password {
            pack(&mut packed, &["AUTH", password]);
        }
        pack(&mut packed, args);
        stream.write_all(&packed)?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        if self.password.is_some() {
            reader.read_line(&mut line)?;
            line.clear();
        }
        reader.read_line(&mut line)?;
        Ok(line.trim_end().to_owned())
    }

    /// Saves the data (`SHUTDOWN SAVE`, so it survives although the
    /// server persists nothing by itself), stops the server, and starts it
    /// again on the same port and directory, where it loads the data back.
    /// Clients see a dropped connection and refused connects meanwhile.
    ///
    /// # Errors
    ///
    /// When it cannot be started again.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Saves the data and stops the server (connections are refused until
    /// [`start_again`](Self::start_again)).
    pub fn stop(&mut self) {
        let _ = self.command(&["SHUTDOWN", "SAVE"]);
        self.reap();
    }

    /// Stops the server and throws its data away, as a server that
    /// persists nothing loses it in a restart: after
    /// [`start_again`](Self::start_again) it is empty (no streams, no
    /// groups, no scripts).
    pub fn stop_losing_data(&mut self) {
        let _ = self.command(&["SHUTDOWN", "NOSAVE"]);
        self.reap();
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
    }

    /// Waits for the stopping server to exit (killing it past
    /// [`STOP_TIMEOUT`]).
    fn reap(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::reap(child, STOP_TIMEOUT);
        }
    }

    /// Starts a stopped server again on the same port and directory.
    ///
    /// # Errors
    ///
    /// When it does not answer in time.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("redis-server is still running");
        }
        self.spawn()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.path().join("redis.log")) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::kill(child);
        }
    }
}

/// A RESP array of bulk strings.
fn pack(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
}
