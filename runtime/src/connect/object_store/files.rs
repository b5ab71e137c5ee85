//! The open files of an object-store sink, one per rendered path, and
//! when each rolls: at `max_records` records, at `max_bytes` encoded bytes,
//! `max_age` after its first record, to make room when `max_open_files`
//! are open, or at shutdown. A closed file leaves with the senders of its
//! records' outcomes, which its upload answers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::encode::{Encoder, FileError, Row};
use super::spool::Spooled;
use crate::connect::SinkError;
use crate::plugin::Message;

/// Where one record's outcome goes once its file is in the store.
pub(super) type Waiter = oneshot::Sender<Result<(), SinkError>>;

/// The roll limits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub records: u64,
    pub bytes: u64,
    pub age: Duration,
    pub open_files: usize,
}

/// A file being filled.
struct OpenFile {
    encoder: Encoder,
    records: u64,
    opened: Instant,
    waiters: Vec<Waiter>,
}

/// A file closed and ready to upload.
pub(super) struct Closed {
    /// Its rendered path (the directory part of its key).
    pub dir: String,
    /// The whole file on the spool, or why it could not be finished.
    pub file: Result<Spooled, FileError>,
    /// Its records.
    pub records: u64,
    /// One per record.
    pub waiters: Vec<Waiter>,
}

/// The open files, by rendered path.
pub(super) struct Files {
    open: HashMap<String, OpenFile>,
    limits: Limits,
}

impl Files {
    pub(super) fn new(limits: Limits) -> Self {
        Files {
            open: HashMap::new(),
            limits,
        }
    }

    /// Appends `rows` (with one waiter each) to the file of `dir`, opening
    /// one with `start` when there is none. Returns the files closed on
    /// the way: this one at a limit (the rest of `rows` then goes into a
    /// new one), or the oldest to make room.
    ///
    /// # Errors
    ///
    /// A file could not be started or written: the rows not yet appended
    /// are given back with their waiters, for the caller to refuse.
    pub(super) fn append(
        &mut self,
        dir: &str,
        mut rows: Vec<(&Message, Row)>,
        mut waiters: Vec<Waiter>,
        start: &dyn Fn() -> Result<Encoder, FileError>,
        closed: &mut Vec<Closed>,
    ) -> Result<(), (FileError, Vec<Waiter>)> {
        while !rows.is_empty() {
            if !self.open.contains_key(dir) {
                if self.open.len() >= self.limits.open_files {
                    self.close_oldest(closed);
                }
                let encoder = match start() {
                    Ok(encoder) => encoder,
                    Err(why) => return Err((why, waiters)),
                };
                self.open.insert(
                    dir.to_owned(),
                    OpenFile {
                        encoder,
                        records: 0,
                        opened: Instant::now(),
                        waiters: Vec::new(),
                    },
                );
            }
            let Some(file) = self.open.get_mut(dir) else {
                break;
            };
            let room = usize::try_from(self.limits.records.saturating_sub(file.records))
                .unwrap_or(usize::MAX)
                .max(1);
            let rest = rows.split_off(room.min(rows.len()));
            let rest_waiters = waiters.split_off(rows.len());
            if let Err(why) = file.encoder.append(&rows) {
                // The file may be half-written: close it without these
                // rows (its earlier records still go up) and refuse them.
                let mut all = waiters;
                all.extend(rest_waiters);
                self.close(dir, closed);
                return Err((why, all));
            }
            file.records += rows.len() as u64;
            file.waiters.extend(waiters);
            if file.records >= self.limits.records || file.encoder.size() >= self.limits.bytes {
                self.close(dir, closed);
            }
            rows = rest;
            waiters = rest_waiters;
        }
        Ok(())
    }

    /// Closes the files open for `max_age` or longer.
    pub(super) fn close_aged(&mut self, now: Instant, closed: &mut Vec<Closed>) {
        let aged: Vec<String> = self
            .open
            .iter()
            .filter(|(_, file)| now.duration_since(file.opened) >= self.limits.age)
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in aged {
            self.close(&dir, closed);
        }
    }

    /// Closes every open file.
    pub(super) fn close_all(&mut self, closed: &mut Vec<Closed>) {
        let dirs: Vec<String> = self.open.keys().cloned().collect();
        for dir in dirs {
            self.close(&dir, closed);
        }
    }

    /// How many files are open.
    pub(super) fn len(&self) -> usize {
        self.open.len()
    }

    /// How long the oldest open file has held its first record.
    pub(super) fn oldest(&self, now: Instant) -> Option<Duration> {
        self.open
            .values()
            .map(|file| now.duration_since(file.opened))
            .max()
    }

    fn close_oldest(&mut self, closed: &mut Vec<Closed>) {
        let oldest = self
            .open
            .iter()
            .min_by_key(|(_, file)| file.opened)
            .map(|(dir, _)| dir.clone());
        if let Some(dir) = oldest {
            self.close(&dir, closed);
        }
    }

    fn close(&mut self, dir: &str, closed: &mut Vec<Closed>) {
        if let Some(file) = self.open.remove(dir) {
            if file.records == 0 {
                return;
            }
            closed.push(Closed {
                dir: dir.to_owned(),
                file: file.encoder.finish(),
                records: file.records,
                waiters: file.waiters,
            });
        }
    }
}
