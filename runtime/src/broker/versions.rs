//! Which configuration each daemon on a shared broker runs: every daemon
//! announces the version of its pipeline files and plugins, so a reload
//! rolled out daemon by daemon can say how long they disagreed.

use async_trait::async_trait;

use super::BrokerError;

/// One daemon's announcement.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Announcement {
    /// The daemon (`<host>-<pid>`).
    pub daemon: String,
    /// The version of the configuration it runs.
    pub version: String,
    /// Since when it runs it, in ms since the Unix epoch.
    pub since_ms: u64,
}

/// Where daemons sharing a broker announce their configuration versions.
/// An announcement lasts [`ANNOUNCEMENT_TTL`] unless renewed, so a daemon
/// that is gone stops counting.
#[async_trait]
pub trait SharedVersions: Send + Sync {
    /// Records (or renews) `announcement`.
    async fn announce(&self, announcement: &Announcement) -> Result<(), BrokerError>;

    /// Every announcement still alive, this daemon's included.
    async fn all(&self) -> Result<Vec<Announcement>, BrokerError>;
}

/// How long an announcement lasts without a renewal.
pub const ANNOUNCEMENT_TTL: std::time::Duration = std::time::Duration::from_secs(30);
