//! What the HTTP server fixtures (moto, Azurite, fake-gcs-server) share:
//! a process on a free loopback port, logging into its own temporary
//! directory, waited for until it answers, paused and resumed by signal,
//! killed when dropped; and one plain HTTP/1.0 request to it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::free_port;

/// How long a server may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times a start is tried: a port found free can be taken
/// before the server binds it.
const START_TRIES: usize = 5;

/// A running server process.
pub struct Served {
    name: &'static str,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Starts server `name`: `command(port, dir)` gives its command line
    /// for a free loopback port and a fresh temporary directory; its
    /// output goes to `<dir>/<name>.log`. Waits until `ready(port)`,
    /// trying again on a new port when the server exits or stays silent.
    ///
    /// # Errors
    ///
    /// The command cannot run (`hint` says what to install), or the
    /// server did not answer within a minute (the error quotes its log).
    pub fn start(
        name: &'static str,
        hint: &str,
        mut command: impl FnMut(u16, &Path) -> Command,
        ready: impl Fn(u16) -> bool,
    ) -> anyhow::Result<Served> {
        let mut last_error = None;
        for _ in 0..START_TRIES {
            let dir = tempfile::Builder::new()
                .prefix(&format!("sluice-{name}-"))
                .tempdir()
                .with_context(|| format!("creating a temporary directory for {name}"))?;
            let port = free_port()?;
            let log = dir.path().join(format!("{name}.log"));
            let out =
                std::fs::File::create(&log).with_context(|| format!("creating {name}'s log"))?;
            let err = out.try_clone().context("cloning a log handle")?;
            let child = command(port, dir.path())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .with_context(|| format!("running {name} ({hint})"))?;
            let mut served = Served {
                name,
                port,
                child: Some(child),
                log,
                _dir: dir,
            };
            match served.wait_ready(&ready) {
                Ok(()) => return Ok(served),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("{name} did not start")))
    }

    fn wait_ready(&mut self, ready: &impl Fn(u16) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                bail!("{} exited with {status}; log:\n{}", self.name, self.log());
            }
            if ready(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer within {START_TIMEOUT:?}; log:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Pauses the server (SIGSTOP): it keeps what it holds and answers
    /// nothing (the kernel accepts connections, which hang) until
    /// [`resume`](Self::resume).
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
        let child = self
            .child
            .as_ref()
            .with_context(|| format!("{} is not running", self.name))?;
        let pid = rustix::process::Pid::from_child(child);
        rustix::process::kill_process(pid, signal)
            .with_context(|| format!("sending {signal:?} to {}", self.name))
    }
}

impl Drop for Served {
    /// Kills the server (also when a test panicked).
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::kill(child);
        }
    }
}

/// One HTTP/1.0 request to `127.0.0.1:port` with `headers` (`Host`,
/// `Content-Length` and `Connection: close` are added), returning the
/// status and the body.
///
/// # Errors
///
/// The connection failed or the response is malformed.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
        .with_context(|| format!("{method} {path}: connecting to {addr}"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
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
