//! Hot reload's shared parts: what asks for one, what it answers, and the
//! record `status` and `/metrics` show.
//!
//! Three triggers ask the same thing: SIGHUP, `sluice run --watch` (a file
//! changed) and `POST /v1/reload` (which `sluice reload` calls, and which
//! alone can force). Each sends a [`ReloadRequest`] to the daemon's own
//! loop, which runs one reload at a time (`daemon::reload` says how) and
//! answers with a [`ReloadReport`].

use std::sync::{Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// SIGHUP (`systemctl reload` with `ExecReload=kill -HUP`, or by hand).
    Signal,
    /// `sluice run --watch`: a pipeline or plugin file changed.
    Watch,
    /// `POST /v1/reload` (`sluice reload`).
    Api,
}

impl Trigger {
    /// Its name in JSON (`signal`, `watch`, `api`).
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::Watch => "watch",
            Trigger::Api => "api",
        }
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::Signal => "SIGHUP",
            Trigger::Watch => "--watch",
            Trigger::Api => "POST /v1/reload",
        })
    }
}

/// One request for a reload, with where to send its report.
#[derive(Debug)]
pub struct ReloadRequest {
    /// Who asked.
    pub trigger: Trigger,
    /// Apply even what is refused by default: removing a topic that still
    /// holds messages.
    pub force: bool,
    /// Where the report goes (dropped unanswered if the daemon stops first).
    pub reply: oneshot::Sender<ReloadReport>,
}

/// What a reload did, or why it changed nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReloadReport {
    /// Whether the new configuration runs now.
    pub ok: bool,
    /// Who asked.
    pub trigger: Trigger,
    /// Whether it was forced.
    pub forced: bool,
    /// When it finished (RFC 3339, UTC).
    pub at: String,
    /// How long it took, validation and drains included.
    pub took_ms: u64,
    /// The version of the configuration running after it (a hash of the
    /// pipeline files and plugins): daemons sharing a NATS that show the
    /// same one run the same files.
    pub version: String,
    /// What changed (nothing when `ok` is false).
    pub changes: Changes,
    /// Why it changed nothing: each problem, at `file:line:col` where it
    /// has a place.
    pub errors: Vec<ReloadError>,
    /// What the operator should know about a reload that succeeded (a
    /// removed stage's consumer keeps its place, say).
    pub warnings: Vec<String>,
}

/// One reason a reload was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReloadError {
    /// The file, when the problem is in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Its 1-based line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// Its 1-based column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub col: Option<u64>,
    /// What is wrong.
    pub message: String,
}

impl ReloadError {
    /// A problem with no place in a file.
    pub fn new(message: impl Into<String>) -> ReloadError {
        ReloadError {
            file: None,
            line: None,
            col: None,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.file, self.line, self.col) {
            (Some(file), Some(line), Some(col)) => {
                write!(f, "{file}:{line}:{col}: {}", self.message)
            }
            (Some(file), _, _) => write!(f, "{file}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl From<&crate::config::Diagnostic> for ReloadError {
    fn from(d: &crate::config::Diagnostic) -> ReloadError {
        ReloadError {
            file: Some(d.file.display().to_string()),
            line: Some(d.line),
            col: Some(d.col),
            message: d.message.clone(),
        }
    }
}

/// What a reload changed. Stages and sources are named `pipeline/name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Changes {
    /// Stages (and sinks) started.
    pub stages_added: Vec<String>,
    /// Stages drained and stopped.
    pub stages_removed: Vec<String>,
    /// Stages drained and started again with new settings or a new plugin.
    pub stages_restarted: Vec<Restart>,
    /// Sources started.
    pub sources_added: Vec<String>,
    /// Sources stopped.
    pub sources_removed: Vec<String>,
    /// Sources stopped and started again with new settings.
    pub sources_restarted: Vec<Restart>,
    /// Topics now declared.
    pub topics_added: Vec<String>,
    /// Topics no longer declared (their messages stay in the broker).
    pub topics_removed: Vec<String>,
    /// Topics whose settings (`high_water_mark`, `retention`) changed.
    pub topics_changed: Vec<String>,
}

impl Changes {
    /// Whether the reload found nothing to change.
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }

    /// One line for the log: `2 stages restarted (shop/charge: plugin), ...`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let mut list = |what: &str, names: &[String]| {
            if !names.is_empty() {
                parts.push(format!("{what} {}", names.join(", ")));
            }
        };
        list("stages added:", &self.stages_added);
        list("stages removed:", &self.stages_removed);
        let restarted: Vec<String> = self
            .stages_restarted
            .iter()
            .map(Restart::to_string)
            .collect();
        list("stages restarted:", &restarted);
        list("sources added:", &self.sources_added);
        list("sources removed:", &self.sources_removed);
        let restarted: Vec<String> = self
            .sources_restarted
            .iter()
            .map(Restart::to_string)
            .collect();
        list("sources restarted:", &restarted);
        list("topics added:", &self.topics_added);
        list("topics removed:", &self.topics_removed);
        list("topics changed:", &self.topics_changed);
        if parts.is_empty() {
            "nothing changed".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// A stage or source started again, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Restart {
    /// `pipeline/name`.
    pub name: String,
    /// What changed: `plugin`, `concurrency 2 -> 4`, `settings`.
    pub why: Vec<String>,
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.why.join(", "))
    }
}

/// Reloads so far, as `GET /v1/reload` and `sluice status` show them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReloadSummary {
    /// Reloads that applied a new configuration (or found it unchanged).
    pub succeeded: u64,
    /// Reloads that changed nothing because of an error.
    pub failed: u64,
    /// The last reload's report, if there was one.
    pub last: Option<ReloadReport>,
}

/// Why a reload could not even be asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadUnavailable {
    /// Nothing here reloads (an admin server without a daemon).
    #[error("this server runs no pipelines to reload")]
    NoDaemon,
    /// Reloads are queued up already.
    #[error("{0} reloads are waiting already; retry once they are done")]
    Busy(usize),
    /// The daemon stopped before it answered.
    #[error("the daemon is shutting down; the reload was not applied")]
    ShuttingDown,
}

/// The most reload requests waiting at once; more are refused (busy).
pub const QUEUE: usize = 4;

/// The reload record of a daemon, and the way to ask it for a reload.
#[derive(Debug, Default)]
pub struct ReloadLog {
    summary: Mutex<ReloadSummary>,
    requests: OnceLock<mpsc::Sender<ReloadRequest>>,
}

impl ReloadLog {
    /// Connects the daemon's reload loop; before this (and without a
    /// daemon) a request is [`ReloadUnavailable::NoDaemon`].
    pub fn connect(&self, requests: mpsc::Sender<ReloadRequest>) {
        let _ = self.requests.set(requests);
    }

    /// Asks for a reload and waits for its report.
    ///
    /// # Errors
    ///
    /// No daemon reloads here, too many reloads wait already, or the
    /// daemon stopped first.
    pub async fn request(
        &self,
        trigger: Trigger,
        force: bool,
    ) -> Result<ReloadReport, ReloadUnavailable> {
        let requests = self.requests.get().ok_or(ReloadUnavailable::NoDaemon)?;
        let (reply, report) = oneshot::channel();
        requests
            .try_send(ReloadRequest {
                trigger,
                force,
                reply,
            })
            .map_err(|err| match err {
                mpsc::error::TrySendError::Full(_) => ReloadUnavailable::Busy(QUEUE),
                mpsc::error::TrySendError::Closed(_) => ReloadUnavailable::ShuttingDown,
            })?;
        report.await.map_err(|_| ReloadUnavailable::ShuttingDown)
    }

    /// Records a finished reload.
    pub fn record(&self, report: &ReloadReport) {
        let mut summary = self.summary.lock().unwrap_or_else(PoisonError::into_inner);
        if report.ok {
            summary.succeeded += 1;
        } else {
            summary.failed += 1;
        }
        summary.last = Some(report.clone());
    }

    /// The counts and the last report.
    pub fn summary(&self) -> ReloadSummary {
        self.summary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_at_their_place_and_changes_summarise() {
        let at = ReloadError {
            file: Some("shop.yaml".into()),
            line: Some(3),
            col: Some(7),
            message: "unknown field `concurrensy`".into(),
        };
        assert_eq!(at.to_string(), "shop.yaml:3:7: unknown field `concurrensy`");
        assert_eq!(ReloadError::new("no place").to_string(), "no place");
        let mut changes = Changes::default();
        assert!(changes.is_empty());
        assert_eq!(changes.summary(), "nothing changed");
        changes.stages_restarted.push(Restart {
            name: "shop/charge".into(),
            why: vec!["plugin".into(), "concurrency 2 -> 4".into()],
        });
        changes.topics_added.push("refunds".into());
        assert_eq!(
            changes.summary(),
            "stages restarted: shop/charge (plugin, concurrency 2 -> 4); topics added: refunds"
        );
    }

    #[tokio::test]
    async fn a_request_without_a_daemon_past_the_queue_or_at_shutdown_is_refused() {
        let log = std::sync::Arc::new(ReloadLog::default());
        assert_eq!(
            log.request(Trigger::Api, false).await,
            Err(ReloadUnavailable::NoDaemon)
        );
        let (tx, rx) = mpsc::channel(1);
        log.connect(tx);
        // The first waits in the queue, unanswered; the second finds it full.
        let first = tokio::spawn({
            let log = log.clone();
            async move { log.request(Trigger::Signal, false).await }
        });
        while log.requests.get().is_some_and(|q| q.capacity() > 0) {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            log.request(Trigger::Api, true).await,
            Err(ReloadUnavailable::Busy(QUEUE))
        );
        // The daemon stops without answering.
        drop(rx);
        assert_eq!(
            first.await.expect("joined"),
            Err(ReloadUnavailable::ShuttingDown)
        );
    }
}
