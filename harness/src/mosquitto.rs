//! Real `mosquitto` brokers for end-to-end tests: [`Mosquitto`] runs one
//! on a free loopback port with its own temporary directory, persistence
//! on (`persistence true`, saved on SIGTERM), `max_queued_messages` far
//! above any test's volume (its default of 1,000 drops the messages queued
//! for an offline client past that), answers a TCP connect before it is
//! handed out, and is killed on drop, even when the test panicked.
//!
//! The binary is `/usr/sbin/mosquitto` (Debian's `mosquitto` package), or
//! `mosquitto` on `$PATH`, or `$SLUICE_MOSQUITTO`. A missing binary is an
//! error that says how to install it, never a skipped test; the system's
//! own broker (port 1883) is never used.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use sluice_harness::mosquitto::Mosquitto;
//!
//! let mut broker = Mosquitto::start()?;
//! let url = broker.url(); // mqtt://127.0.0.1:<free port>
//! broker.restart()?; // SIGTERM (saves), then the same port and directory
//! # Ok(()) }
//! ```

use crate::process::free_port;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a broker may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM may take (it writes its persistence file) before the
/// broker is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

/// Options beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Require this user and password (no anonymous clients).
    pub password: Option<(String, String)>,
    /// An ACL file's text (`topic readwrite in/#` ...), applied to every
    /// client (anonymous ones too).
    pub acl: Option<String>,
    /// Also serve TLS, on a second port ([`Mosquitto::tls_url`]), with
    /// this certificate and key (PEM); the first port stays plain, for
    /// outside clients.
    pub tls: Option<(String, String)>,
}

/// A running `mosquitto` of this test's own.
pub struct Mosquitto {
    child: Option<Child>,
    port: u16,
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts a broker on a free port that takes anonymous clients.
    ///
    /// # Errors
    ///
    /// When `mosquitto` cannot be found or run, or does not accept
    /// connections in time (the error quotes its log).
    pub fn start() -> anyhow::Result<Mosquitto> {
        Mosquitto::start_with(&Options::default())
    }

    /// [`start`](Self::start) with `options`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); also when the password file cannot be
    /// made (`mosquitto_passwd`).
    pub fn start_with(options: &Options) -> anyhow::Result<Mosquitto> {
        let dir = tempfile::tempdir().context("a temporary directory for mosquitto")?;
        let port = free_port()?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        let mut conf = format!(
            "listener {port} 127.0.0.1\n\
             persistence true\n\
             persistence_location {data}/\n\
             log_dest file {log}\n\
             log_type error\nlog_type warning\nlog_type notice\nlog_type information\n\
             max_queued_messages 200000\n\
             max_inflight_messages 1000\n\
             max_keepalive 600\n\
             autosave_interval 0\n",
            data = data.display(),
            log = dir.path().join("mosquitto.log").display(),
        );
        if rustix::process::geteuid().is_root() {
            // Started as root, mosquitto drops to the `mosquitto` user,
            // which cannot write this directory (its log, its persistence).
            conf.push_str("user root\n");
        }
        match &options.password {
            Some((user, password)) => {
                let file = dir.path().join("passwd");
                std::fs::write(&file, "")?;
                let status = Command::new(passwd_binary())
                    .arg("-b")
                    .arg(&file)
                    .arg(user)
                    .arg(password)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .context("running mosquitto_passwd")?;
                if !status.success() {
                    bail!("mosquitto_passwd failed ({status})");
                }
                conf.push_str(&format!(
                    "allow_anonymous false\npassword_file {}\n",
                    file.display()
                ));
            }
            None => conf.push_str("allow_anonymous true\n"),
        }
        if let Some(acl) = &options.acl {
            let file = dir.path().join("acl");
            std::fs::write(&file, acl)?;
            conf.push_str(&format!("acl_file {}\n", file.display()));
        }
        let mut tls_port = None;
        if let Some((cert, key)) = &options.tls {
            let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert_file, cert)?;
            std::fs::write(&key_file, key)?;
            let port = free_port()?;
            // Settings after a `listener` line are that listener's.
            conf.push_str(&format!(
                "listener {port} 127.0.0.1\ncertfile {}\nkeyfile {}\n",
                cert_file.display(),
                key_file.display()
            ));
            tls_port = Some(port);
        }
        std::fs::write(dir.path().join("mosquitto.conf"), conf)?;
        let mut broker = Mosquitto {
            child: None,
            port,
            tls_port,
            dir,
        };
        broker.spawn()?;
        Ok(broker)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new(binary())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "could not run `{}`; install it (`apt-get install mosquitto`) or set \
                     $SLUICE_MOSQUITTO",
                    binary().display()
                )
            })?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "mosquitto exited ({status}) on port {}; log:\n{}",
                    self.port,
                    self.log()
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "mosquitto did not accept connections on port {} within {START_TIMEOUT:?}; \
                     log:\n{}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// `mqtts://localhost:<port>` of the TLS listener, when started with
    /// [`Options::tls`] (`localhost`, a name the test certificates carry).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("mqtts://localhost:{port}"))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's directory (its configuration, log and data).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the broker with SIGTERM (it saves its sessions and queued
    /// messages) and starts it again on the same port and directory,
    /// where it loads them back. Clients see a dropped connection and
    /// refused connects meanwhile.
    ///
    /// # Errors
    ///
    /// When it cannot be started again.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Stops the broker with SIGTERM (saving its data); connections are
    /// refused until [`start_again`](Self::start_again).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::terminate(child, STOP_TIMEOUT);
        }
    }

    /// Starts a stopped broker again on the same port and directory.
    ///
    /// # Errors
    ///
    /// When it does not accept connections in time.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("mosquitto is still running");
        }
        self.spawn()
    }

    /// The broker's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::kill(child);
        }
    }
}

/// `$SLUICE_MOSQUITTO`, else `/usr/sbin/mosquitto` (Debian puts it outside
/// a user's `$PATH`), else `mosquitto`.
fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_MOSQUITTO").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let debian = PathBuf::from("/usr/sbin/mosquitto");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("mosquitto")
    }
}

/// `mosquitto_passwd`, beside the broker.
fn passwd_binary() -> PathBuf {
    let beside = binary().with_file_name("mosquitto_passwd");
    if beside.exists() {
        return beside;
    }
    for dir in ["/usr/bin", "/usr/sbin"] {
        let path = Path::new(dir).join("mosquitto_passwd");
        if path.exists() {
            return path;
        }
    }
    PathBuf::from("mosquitto_passwd")
}
