//! A real S3 (and SQS) API for tests: moto's server (`moto[server]` from PyPI, which
//! `cargo xtask setup` installs), on a free loopback port, killed on drop.
//!
//! ```no_run
//! let s3 = sluice_harness::moto::MotoServer::start()?;
//! s3.create_bucket("claims")?;
//! // endpoint: s3.endpoint(), allow_http: true, credentials: s3.env()
//! # anyhow::Ok(())
//! ```

use std::process::Command;

use anyhow::bail;

use crate::served::{self, Served};

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
    served: Served,
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
        let served = Served::start(
            "moto",
            "is moto[server] installed? `cargo xtask setup`",
            |port, _dir| {
                let mut command = Command::new("python3");
                command.args(["-c", LAUNCHER, "-H", "127.0.0.1", "-p", &port.to_string()]);
                command
            },
            |port| matches!(served::request(port, "GET", "/", &[], &[]), Ok((200, _))),
        )?;
        Ok(MotoServer { served })
    }

    /// `http://127.0.0.1:<port>`: the `endpoint` to configure.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.served.port())
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
        served::request(self.served.port(), method, path, &[], body)
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        self.served.log()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.served.pid()
    }

    /// Pauses the server (SIGSTOP): it keeps everything it holds (moto
    /// keeps nothing across a restart) and answers nothing (connections
    /// are accepted by the kernel and hang) until [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.served.pause()
    }

    /// Resumes a [`pause`](Self::pause)d server (SIGCONT).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.served.resume()
    }
}
