//! `sluice run --watch`: a reload when a pipeline file or a plugin changes.
//!
//! The files are polled (size, modification time, inode) twice a second,
//! not watched with inotify: polling sees every way a file gets replaced
//! (an editor's rename, `cp` over it, a Kubernetes ConfigMap's symlink
//! swap, a network file system), and a few dozen `stat` calls a second
//! cost nothing. A change is acted on once the files have stood still for
//! one more poll, so a plugin still being written or several files saved
//! together make one reload, not a failed one per write.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, watch};

use crate::reload::{ReloadRequest, Trigger};

/// How often the files are looked at.
const POLL: Duration = Duration::from_millis(500);

/// What is known of one file: `None` when it does not exist.
type Stamp = Option<(u64, SystemTime, u64)>;

/// Polls the files `watched` names (a directory stands for its `*.yaml`
/// and `*.yml` files) and asks for a reload when they change, until the
/// daemon stops. Each report goes to the log through the daemon's loop.
pub(super) async fn watch(
    mut watched: watch::Receiver<Vec<PathBuf>>,
    requests: mpsc::Sender<ReloadRequest>,
) {
    tracing::info!("watching the pipeline files and plugins (--watch): a change reloads them");
    let mut seen = stamps(&watched.borrow_and_update());
    // A change seen, waiting for the files to stand still.
    let mut pending = false;
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A reload changed the set of files (a stage added): start from
        // what they are now.
        if watched.has_changed().unwrap_or(false) {
            seen = stamps(&watched.borrow_and_update());
            pending = false;
            continue;
        }
        let now = stamps(&watched.borrow());
        if now != seen {
            for path in changed(&seen, &now) {
                tracing::debug!(file = %path.display(), "changed");
            }
            seen = now;
            pending = true;
            continue;
        }
        if !pending {
            continue;
        }
        pending = false;
        tracing::info!("a pipeline file or plugin changed: reloading");
        let (reply, report) = oneshot::channel();
        let request = ReloadRequest {
            trigger: Trigger::Watch,
            force: false,
            reply,
        };
        if requests.send(request).await.is_err() {
            return;
        }
        // One at a time: the next look starts from after this reload.
        let _ = report.await;
        seen = stamps(&watched.borrow_and_update());
    }
}

/// The stamp of every file `paths` names.
fn stamps(paths: &[PathBuf]) -> BTreeMap<PathBuf, Stamp> {
    let mut out = BTreeMap::new();
    for path in paths {
        if path.is_dir() {
            let Ok(entries) = std::fs::read_dir(path) else {
                out.insert(path.clone(), None);
                continue;
            };
            for entry in entries.filter_map(Result::ok) {
                let file = entry.path();
                if file.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    out.insert(file.clone(), stamp(&file));
                }
            }
        } else {
            out.insert(path.clone(), stamp(path));
        }
    }
    out
}

/// Size, modification time and inode (following symlinks).
fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?, meta.ino()))
}

/// The files whose stamps differ between `before` and `after`.
fn changed<'a>(
    before: &'a BTreeMap<PathBuf, Stamp>,
    after: &'a BTreeMap<PathBuf, Stamp>,
) -> Vec<&'a PathBuf> {
    after
        .iter()
        .filter(|(path, stamp)| before.get(*path) != Some(*stamp))
        .map(|(path, _)| path)
        .chain(before.keys().filter(|path| !after.contains_key(*path)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_stands_for_its_yaml_files_and_changes_are_seen() {
        let dir = tempfile::tempdir().expect("dir");
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, "one").expect("write");
        std::fs::write(dir.path().join("notes.txt"), "x").expect("write");
        let before = stamps(&[dir.path().to_path_buf()]);
        assert_eq!(before.keys().collect::<Vec<_>>(), vec![&a]);
        std::fs::write(&a, "two, longer").expect("write");
        let b = dir.path().join("b.yml");
        std::fs::write(&b, "new").expect("write");
        let after = stamps(&[dir.path().to_path_buf()]);
        let mut seen = changed(&before, &after);
        seen.sort();
        assert_eq!(seen, vec![&a, &b]);
        std::fs::remove_file(&a).expect("remove");
        let gone = stamps(&[dir.path().to_path_buf()]);
        assert_eq!(changed(&after, &gone), vec![&a]);
        // A missing file is a stamp too: its arrival is a change.
        let missing = dir.path().join("later.wasm");
        let none = stamps(std::slice::from_ref(&missing));
        std::fs::write(&missing, "x").expect("write");
        assert_eq!(
            changed(&none, &stamps(std::slice::from_ref(&missing))),
            vec![&missing]
        );
    }
}
