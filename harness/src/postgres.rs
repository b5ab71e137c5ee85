//! A real Postgres server for end-to-end tests: `initdb` and `pg_ctl` in a
//! temporary directory, on a free loopback port, its unix socket inside
//! that directory, password (SCRAM) authentication over TCP for a test
//! superuser. Never the machine's own cluster or its default port.
//!
//! Postgres refuses to run as root: when the tests run as root, every
//! server binary runs through `runuser -u postgres --`, and the directory
//! is handed to the `postgres` user.

use crate::process::free_port;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};

/// Where the Postgres binaries are looked for: `$SLUICE_PG_BIN`, else the
/// Debian/Ubuntu layout of the newest installed major version.
pub fn postgres_bin() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SLUICE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: install postgresql or set SLUICE_PG_BIN")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found
        .pop()
        .context("no initdb under /usr/lib/postgresql/*/bin; set SLUICE_PG_BIN")
}

/// The test superuser's name.
pub const USER: &str = "sluice";

/// One Postgres server of a test, stopped and removed on drop.
pub struct PostgresServer {
    bin: PathBuf,
    port: u16,
    password: String,
    as_postgres: bool,
    running: bool,
    dir: tempfile::TempDir,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PostgresServer {
    /// `initdb` and start a server on a free port, and wait until it takes
    /// connections.
    ///
    /// # Errors
    ///
    /// When the binaries are missing, `initdb` fails, or the server does
    /// not start (the error quotes its log).
    pub fn start() -> anyhow::Result<PostgresServer> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let bin = postgres_bin()?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("sluice-pg-")
            .tempdir()
            .context("a temporary directory for postgres")?;
        let password = format!(
            "pw-{}-{}-s3cret",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        std::fs::write(dir.path().join("pwfile"), &password)?;
        if as_postgres {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()?;
            if !status.success() {
                bail!("chown of {} to postgres failed", dir.path().display());
            }
        }
        let mut server = PostgresServer {
            bin,
            port: 0,
            password,
            as_postgres,
            running: false,
            dir,
        };
        let data = server.data();
        let pwfile = server.dir.path().join("pwfile");
        let out = server.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                USER.as_ref(),
                format!("--pwfile={}", pwfile.display()).as_ref(),
                "--auth-local=trust".as_ref(),
                "--auth-host=scram-sha-256".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--no-sync".as_ref(),
            ],
        )?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut attempt = 0;
        loop {
            server.port = free_port()?;
            match server.start_again() {
                Ok(()) => return Ok(server),
                Err(_) if attempt < 4 => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<Output> {
        let exe = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .with_context(|| format!("running {}", exe.display()))
    }

    /// Starts the server again (after [`stop`](Self::stop)) on the same
    /// port with the same data.
    ///
    /// # Errors
    ///
    /// When it does not start within 60 s.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let data = self.data();
        let log = self.log_path();
        let out = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-o".as_ref(),
                options.as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "start".as_ref(),
            ],
        )?;
        if !out.status.success() {
            bail!(
                "pg_ctl start failed: {}{}\nlog:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        self.running = true;
        Ok(())
    }

    /// Stops the server at once (`-m immediate`: like a crash; the data
    /// is recovered on the next start).
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        let data = self.data();
        let _ = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "immediate".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        );
        self.running = false;
    }

    /// Stops and starts it again: same port, same data.
    ///
    /// # Errors
    ///
    /// As [`start_again`](Self::start_again).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.start_again()
    }

    /// `postgres://sluice:<password>@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/postgres",
            self.password, self.port
        )
    }

    /// The test user's password (to check it is never shown).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The unix socket directory.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `sql` with `psql` over the unix socket and returns its
    /// unaligned, tuples-only output, trimmed.
    ///
    /// # Errors
    ///
    /// When psql fails (the error quotes it).
    pub fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let port = self.port.to_string();
        let out = self.run(
            "psql",
            &[
                "-h".as_ref(),
                self.dir.path().as_os_str(),
                "-p".as_ref(),
                port.as_ref(),
                "-U".as_ref(),
                USER.as_ref(),
                "-d".as_ref(),
                "postgres".as_ref(),
                "-v".as_ref(),
                "ON_ERROR_STOP=1".as_ref(),
                "-At".as_ref(),
                "-c".as_ref(),
                sql.as_ref(),
            ],
        )?;
        if !out.status.success() {
            bail!(
                "psql `{sql}` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Turns TLS on with this certificate and key (PEM), and accepts TCP
    /// connections over TLS only (`hostssl`): a client that does not
    /// speak TLS is refused, so a test that connects has proved TLS.
    /// Restarts the server.
    ///
    /// # Errors
    ///
    /// When the files cannot be written or the server does not start.
    pub fn enable_tls(&mut self, cert_pem: &str, key_pem: &str) -> anyhow::Result<()> {
        let data = self.data();
        let cert = data.join("server.crt");
        let key = data.join("server.key");
        std::fs::write(&cert, cert_pem)?;
        std::fs::write(&key, key_pem)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        }
        if self.as_postgres {
            let status = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&cert)
                .arg(&key)
                .status()?;
            if !status.success() {
                bail!("chown of the TLS files to postgres failed");
            }
        }
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        std::io::Write::write_all(
            &mut conf,
            b"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
        )?;
        let hba = data.join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba)?;
        let only_tls: String = text
            .lines()
            .map(|line| match line.strip_prefix("host ") {
                Some(rest) => format!("hostssl {rest}\n"),
                None => format!("{line}\n"),
            })
            .collect();
        std::fs::write(&hba, only_tls)?;
        self.restart()
    }

    /// After [`enable_tls`](Self::enable_tls): every TLS connection must
    /// also show a client certificate that `client_ca_pem` vouches for
    /// (`clientcert=verify-ca`; a self-signed client certificate can be
    /// its own CA). Restarts the server.
    pub fn require_client_certs(&mut self, client_ca_pem: &str) -> anyhow::Result<()> {
        let data = self.data();
        let ca = data.join("client-ca.crt");
        std::fs::write(&ca, client_ca_pem)?;
        if self.as_postgres {
            let status = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&ca)
                .status()?;
            if !status.success() {
                bail!("chown of the client CA to postgres failed");
            }
        }
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        std::io::Write::write_all(&mut conf, b"\nssl_ca_file = 'client-ca.crt'\n")?;
        let hba = data.join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba)?;
        let verified: String = text
            .lines()
            .map(|line| {
                if line.starts_with("hostssl ") {
                    format!("{line} clientcert=verify-ca\n")
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        std::fs::write(&hba, verified)?;
        self.restart()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
