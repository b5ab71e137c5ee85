//! A real S3 (and SQS) API for tests: moto's server (`moto[server]` from PyPI, which
//! `cargo xtask setup` installs), on a free loopback port, killed on drop.
//!
//! ```no_run
//! let s3 = sluice_harness::moto::MotoServer::start()?;
//! s3.create_bucket("claims")?;
//! // endpoint: s3.endpoint(), allow_http: true, credentials: s3.env()
//! # anyhow::Ok(())
//! ```

use crate::process::free_port;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long the server may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `moto.server` after one change that keeps its behaviour and drops
/// a quadratic cost. moto 5's SQS `receive_message` checks each message's
/// retention through `get_queue_attributes`, which computes every attribute
/// of the queue, counts included, by scanning all its messages; and it
/// reads the clock through three `datetime` objects a call. At a depth of a
/// thousand, one receive took 300 ms and the SQS round trip of 20,000
/// messages took 12 minutes, bound by moto. The patched check reads the one
/// attribute it needs, and the clock is `time.time()`, the same epoch
/// seconds: what the server accepts, keeps and returns is unchanged.
const LAUNCHER: &str = r#"
import sys, time
import moto.sqs.models as sqs
def retained(self, queue_name, message):
    retention = int(self.get_queue(queue_name).message_retention_period)
    return retention + message.sent_timestamp / 1000 > time.time()
sqs.SQSBackend.is_message_valid_based_on_retention_period = retained
_unix_time, _unix_time_millis = sqs.unix_time, sqs.unix_time_millis
sqs.unix_time = lambda dt=None: time.time() if dt is None else _unix_time(dt)
sqs.unix_time_millis = lambda dt=None: (
    time.time() * 1000.0 if dt is None else _unix_time_millis(dt))
from moto.server import main
main()
"#;

/// The credentials tests give the daemon: moto accepts any.
pub const ACCESS_KEY_ID: &str = "sluice-test";
/// See [`ACCESS_KEY_ID`].
pub const SECRET_ACCESS_KEY: &str = "sluice-test-secret";
/// The region tests use.
pub const REGION: &str = "us-east-1";

/// A running moto S3 server.
pub struct MotoServer {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl MotoServer {
    /// Starts moto's server ([`LAUNCHER`]) on a free loopback port and waits
    /// until it answers.
    ///
    /// # Errors
    ///
    /// python3 or moto is missing (run `cargo xtask setup`), or the server
    /// does not answer within a minute (the error quotes its log).
    pub fn start() -> anyhow::Result<MotoServer> {
        let mut last_error = None;
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("sluice-moto-")
                .tempdir()
                .context("creating a temporary directory for moto")?;
            let port = free_port()?;
            let log = dir.path().join("moto.log");
            let out = std::fs::File::create(&log).context("creating moto's log")?;
            let err = out.try_clone().context("cloning moto's log handle")?;
            let child = Command::new("python3")
                .args(["-c", LAUNCHER, "-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .context(
                    "running python3 for moto's server (is moto[server] installed? `cargo xtask setup`)",
                )?;
            let mut server = MotoServer {
                port,
                child: Some(child),
                log,
                _dir: dir,
            };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("moto did not start")))
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                bail!("moto exited with {status}; log:\n{}", self.log());
            }
            if let Ok((200, _)) = self.request("GET", "/", &[]) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "moto did not answer within {START_TIMEOUT:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:<port>`: the `endpoint` to configure.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Environment variables that point an AWS client at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_ACCESS_KEY.into()),
            ("AWS_DEFAULT_REGION".into(), REGION.into()),
        ]
    }

    /// Creates a bucket.
    ///
    /// # Errors
    ///
    /// The request failed or was refused.
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        match self.request("PUT", &format!("/{bucket}"), &[])? {
            (200, _) => Ok(()),
            (status, body) => bail!(
                "creating bucket {bucket}: {status} {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// One unsigned HTTP/1.0 request, returning the status and body. Moto
    /// takes unsigned requests for bucket creation; objects of a private
    /// bucket need signed ones (use an S3 client with [`MotoServer::env`]'s
    /// credentials).
    ///
    /// # Errors
    ///
    /// The connection failed or the response is malformed.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
            .with_context(|| format!("{method} {path}: connecting to moto"))?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )?;
        stream.write_all(body)?;
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("{method} {path}: no status line in {status_line:?}"))?;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
        }
        let mut out = Vec::new();
        reader.read_to_end(&mut out)?;
        Ok((status, out))
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Pauses the server (SIGSTOP): it keeps everything it holds (moto
    /// keeps nothing across a restart) and answers nothing (connections
    /// are accepted by the kernel and hang) until [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(rustix::process::Signal::STOP)
    }

    /// Resumes a [`pause`](Self::pause)d server (SIGCONT).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(rustix::process::Signal::CONT)
    }

    fn signal(&self, signal: rustix::process::Signal) -> anyhow::Result<()> {
        let child = self.child.as_ref().context("moto is not running")?;
        let pid = rustix::process::Pid::from_child(child);
        rustix::process::kill_process(pid, signal)
            .with_context(|| format!("sending {signal:?} to moto"))
    }
}

impl Drop for MotoServer {
    /// Kills the server (also when a test panicked).
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::kill(child);
        }
    }
}
