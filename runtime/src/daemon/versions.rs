//! Several daemons on one NATS each reload their own files, one after
//! another: for a while they run different configurations. Each daemon
//! announces the version it runs ([`crate::broker::versions`]) and logs
//! when it sees the daemons disagree, and, once they agree again, how long
//! the switch took from the first daemon's to the last one's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::StageKey;
use crate::broker::versions::{Announcement, SharedVersions};
use crate::config::Pipeline;

/// How often a daemon renews its announcement and looks at the others'.
const RENEW_EVERY: Duration = Duration::from_secs(2);

/// The version of a configuration: the first 12 hex digits of a sha256
/// over the pipeline files' bytes (in name order, without their paths, so
/// daemons that install the same files in different places agree) and
/// the plugins' sha256s by stage.
pub(super) fn version(pipelines: &[Pipeline], plugin_shas: &HashMap<StageKey, String>) -> String {
    let mut hasher = Sha256::new();
    let mut files: Vec<(String, Vec<u8>)> = pipelines
        .iter()
        .map(|p| (p.name.clone(), std::fs::read(&p.source).unwrap_or_default()))
        .collect();
    files.sort();
    for (name, bytes) in files {
        for part in [name.as_bytes(), &bytes] {
            hasher.update(u64::try_from(part.len()).unwrap_or(u64::MAX).to_le_bytes());
            hasher.update(part);
        }
    }
    let shas: BTreeMap<&StageKey, &String> = plugin_shas.iter().collect();
    for ((pipeline, stage), sha) in shas {
        for part in [pipeline, stage, sha] {
            hasher.update(u64::try_from(part.len()).unwrap_or(u64::MAX).to_le_bytes());
            hasher.update(part.as_bytes());
        }
    }
    let digest = hasher.finalize();
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// Announces this daemon's version (on every change, and every
/// [`RENEW_EVERY`]) and logs what the daemons run, until the daemon stops.
pub(super) async fn track(shared: Arc<dyn SharedVersions>, mut version: watch::Receiver<String>) {
    let daemon = crate::connect::names::this_daemon();
    let mut since_ms = crate::broker::now_millis();
    let mut split = false;
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = version.changed() => {
                if changed.is_err() {
                    return;
                }
                since_ms = crate::broker::now_millis();
            }
        }
        let current = version.borrow_and_update().clone();
        let announced = shared
            .announce(&Announcement {
                daemon: daemon.clone(),
                version: current.clone(),
                since_ms,
            })
            .await;
        let all = match announced {
            Ok(()) => shared.all().await,
            Err(err) => Err(err),
        };
        let all = match all {
            Ok(all) => all,
            Err(err) => {
                tracing::debug!(error = %err, "cannot share the configuration version");
                continue;
            }
        };
        match (split, agreement(&all)) {
            (false, Agreement::Split(by_version)) => {
                split = true;
                tracing::warn!(
                    "the daemons on this NATS run different configurations: {by_version}; this one ({daemon}) runs {current}; until they agree, a message may be handled by either"
                );
            }
            (true, Agreement::Agree { daemons, window }) => {
                split = false;
                tracing::info!(
                    "all {daemons} daemons on this NATS run configuration {current} again; they switched to it over {:.1} s",
                    window.as_secs_f64()
                );
            }
            _ => {}
        }
    }
}

/// What the announcements say.
#[derive(Debug, PartialEq)]
enum Agreement {
    /// One version: how many daemons run it, and how far apart their
    /// switches to it were.
    Agree { daemons: usize, window: Duration },
    /// Several: `version (daemon, ...); ...`.
    Split(String),
}

fn agreement(all: &[Announcement]) -> Agreement {
    let mut by_version: BTreeMap<&str, Vec<&Announcement>> = BTreeMap::new();
    for announcement in all {
        by_version
            .entry(&announcement.version)
            .or_default()
            .push(announcement);
    }
    if by_version.len() <= 1 {
        let first = all.iter().map(|a| a.since_ms).min().unwrap_or_default();
        let last = all.iter().map(|a| a.since_ms).max().unwrap_or_default();
        return Agreement::Agree {
            daemons: all.len(),
            window: Duration::from_millis(last - first),
        };
    }
    Agreement::Split(
        by_version
            .iter()
            .map(|(version, daemons)| {
                let names: Vec<&str> = daemons.iter().map(|a| a.daemon.as_str()).collect();
                format!("{version} ({})", names.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(daemon: &str, version: &str, since_ms: u64) -> Announcement {
        Announcement {
            daemon: daemon.into(),
            version: version.into(),
            since_ms,
        }
    }

    #[test]
    fn announcements_agree_or_split_by_version() {
        assert_eq!(
            agreement(&[at("a", "v2", 1_000), at("b", "v2", 13_400)]),
            Agreement::Agree {
                daemons: 2,
                window: Duration::from_millis(12_400)
            }
        );
        assert_eq!(
            agreement(&[at("a", "v2", 1), at("b", "v1", 2), at("c", "v2", 3)]),
            Agreement::Split("v1 (b); v2 (a, c)".into())
        );
    }

    #[test]
    fn the_version_follows_the_files_and_the_plugins_not_their_paths() {
        let dir = tempfile::tempdir().expect("dir");
        let write = |sub: &str, text: &str| {
            let path = dir.path().join(sub);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
            crate::config::load(&[path]).expect("a valid pipeline")
        };
        let yaml = "name: p\ntopics: [a]\nstages:\n  - {name: s, subscribe: a, plugin: x.wasm}\n";
        let here = write("one/p.yaml", yaml);
        let there = write("two/p.yaml", yaml);
        let shas = HashMap::from([(("p".to_owned(), "s".to_owned()), "abc".to_owned())]);
        assert_eq!(version(&here, &shas), version(&there, &shas));
        let other_plugin = HashMap::from([(("p".to_owned(), "s".to_owned()), "abd".to_owned())]);
        assert_ne!(version(&here, &shas), version(&here, &other_plugin));
        let changed = write("three/p.yaml", &yaml.replace("[a]", "[a, b]"));
        assert_ne!(version(&here, &shas), version(&changed, &shas));
        assert_eq!(version(&here, &shas).len(), 12);
    }
}
