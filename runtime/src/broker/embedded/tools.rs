//! Offline tools for a stopped data directory, behind `sluice data`:
//!
//! - [`check`] verifies the journals and reads every table, and reports
//!   what is damaged and which topics, seq ranges and consumers it touches.
//!   It never writes to the data directory: fjall opens a scratch copy
//!   (opening truncates a journal), with each journal cut at its damage.
//! - [`salvage`] does the same and copies everything readable into a new
//!   data directory, then reports exactly what was lost.
//! - [`quarantine`] rebuilds a data directory without one topic's seq range
//!   (a damaged table block a stage cannot read past), keeping the old
//!   store beside it, so the stage moves on.
//!
//! Every tool takes the data directory's lock first, so none runs beside a
//! daemon.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::database::{Store, guard_panic};
use super::journal::{self, JournalFile};
use super::store::{TopicRecord, decode, encode, key_seq, msg_key};
use super::{LOCK_FILE, recover};
use crate::broker::BrokerError;

/// Why a tool could not run (as opposed to what it found).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A daemon holds the directory.
    #[error(
        "{0} is in use by a running sluice daemon (its broker.lock is held); stop the daemon first"
    )]
    InUse(PathBuf),
    /// No store there.
    #[error("{0} holds no embedded store (no store/ directory)")]
    NoStore(PathBuf),
    /// The target of a salvage is not empty.
    #[error("{0} exists and is not empty; salvage writes into a new directory")]
    TargetNotEmpty(PathBuf),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The store could not be read or written.
    #[error("{0}")]
    Storage(#[from] BrokerError),
}

/// What a damaged spot touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touch {
    /// Messages of a topic, seqs `from..=to`; `to` is None when the end
    /// cannot be known (a damaged journal batch that could not be read).
    Messages {
        /// The topic.
        topic: String,
        /// First seq.
        from: u64,
        /// Last seq, if known.
        to: Option<u64>,
    },
    /// A consumer's position (cursor, pending entries) recorded after the
    /// damage: messages it completed may be delivered again.
    Consumer {
        /// The consumer.
        consumer: String,
    },
    /// Other records of one keyspace (topic counters, the duplicate
    /// window, stage dedup records).
    Keyspace {
        /// fjall's keyspace name.
        keyspace: String,
    },
}

impl fmt::Display for Touch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Touch::Messages {
                topic,
                from,
                to: Some(to),
            } => write!(f, "topic {topic}: messages seq {from}..={to}"),
            Touch::Messages {
                topic,
                from,
                to: None,
            } => write!(
                f,
                "topic {topic}: messages from seq {from} on that were in the unreadable batch (how many is unknown)"
            ),
            Touch::Consumer { consumer } => write!(
                f,
                "consumer {consumer}: progress (cursor, pending) recorded after the damage; \
                 messages it completed then may be delivered again"
            ),
            Touch::Keyspace { keyspace } => write!(f, "records in keyspace {keyspace}"),
        }
    }
}

/// One damaged spot.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What is damaged, and where (file, offset, error).
    pub what: String,
    /// What it touches.
    pub touches: Vec<Touch>,
}

/// What a tool found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The data directory.
    pub data_dir: PathBuf,
    /// Damage found.
    pub damage: Vec<Finding>,
    /// Torn tails (an interrupted last write, never acknowledged): dropped
    /// at start, not damage.
    pub torn_tails: Vec<String>,
    /// Messages read per topic.
    pub messages: BTreeMap<String, u64>,
}

impl Report {
    /// Whether nothing is damaged.
    pub fn is_clean(&self) -> bool {
        self.damage.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (topic, n) in &self.messages {
            writeln!(f, "topic {topic}: {n} messages readable")?;
        }
        for t in &self.torn_tails {
            writeln!(
                f,
                "torn tail (an interrupted last write, dropped at start): {t}"
            )?;
        }
        if self.damage.is_empty() {
            return writeln!(f, "ok: {} is not damaged", self.data_dir.display());
        }
        for d in &self.damage {
            writeln!(f, "DAMAGED: {}", d.what)?;
            for t in &d.touches {
                writeln!(f, "  touches {t}")?;
            }
        }
        Ok(())
    }
}

/// Verifies the stopped data directory `data_dir`. Changes nothing in it.
///
/// # Errors
///
/// When it is in use, holds no store, or cannot be read at all.
pub fn check(data_dir: &Path) -> Result<Report, ToolError> {
    let _lock = lock(data_dir)?;
    let scratch = Scratch::new()?;
    let (report, _store) = examine(data_dir, &scratch.path)?;
    Ok(report)
}

/// Copies everything readable from the stopped data directory `data_dir`
/// into `to` (a new data directory), and reports what was lost. Changes
/// nothing in `data_dir`. The report is also written to
/// `to/salvage-report.txt`.
///
/// # Errors
///
/// As [`check`], and when `to` is not empty or cannot be written.
pub fn salvage(data_dir: &Path, to: &Path) -> Result<Report, ToolError> {
    let _lock = lock(data_dir)?;
    if std::fs::read_dir(to).is_ok_and(|mut d| d.next().is_some()) {
        return Err(ToolError::TargetNotEmpty(to.to_owned()));
    }
    let scratch = Scratch::new()?;
    let (report, source) = examine(data_dir, &scratch.path)?;
    let Some(source) = source else {
        return Ok(report);
    };
    let lost_last = lost_last_seqs(&report);
    rebuild(&source, &to.join("store"), &lost_last, |_, _| false)?;
    drop(source);
    let text = format!(
        "salvaged {} into {}\n{report}",
        data_dir.display(),
        to.display()
    );
    std::fs::write(to.join("salvage-report.txt"), text).map_err(|e| io("writing the report", e))?;
    Ok(report)
}

/// What [`quarantine`] removed.
#[derive(Debug, Clone)]
pub struct Quarantined {
    /// The topic.
    pub topic: String,
    /// The range asked for.
    pub from: u64,
    /// The range asked for.
    pub to: u64,
    /// Messages of the range that could still be read (and were removed).
    pub readable: u64,
    /// Where the old store was kept.
    pub kept: PathBuf,
}

impl fmt::Display for Quarantined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "quarantined topic {} seq {}..={} ({} of them still readable, the rest damaged); \
             the old store is kept in {}",
            self.topic,
            self.from,
            self.to,
            self.readable,
            self.kept.display()
        )
    }
}

/// Rebuilds the stopped data directory `data_dir` without messages
/// `from..=to` of `topic` (and without anything unreadable), keeping the
/// old store as `store.quarantined-<time>`, and appends what was removed to
/// `quarantine-report.txt` there. Refuses a damaged journal (salvage it).
///
/// # Errors
///
/// As [`check`]; when the topic is unknown or the journal is damaged.
pub fn quarantine(
    data_dir: &Path,
    topic: &str,
    from: u64,
    to: u64,
) -> Result<Quarantined, ToolError> {
    let _lock = lock(data_dir)?;
    let store_dir = data_dir.join("store");
    let journals = read_journals(&store_dir)?;
    if let Some(why) = journals.iter().find_map(JournalFile::refusal) {
        return Err(ToolError::Storage(BrokerError::Storage(format!(
            "{why}; quarantine works on table damage only: salvage this data directory"
        ))));
    }
    let scratch = Scratch::new()?;
    let (_, source) = examine(data_dir, &scratch.path)?;
    let source = source
        .ok_or_else(|| BrokerError::Storage(format!("{} does not open", store_dir.display())))?;
    let topic_id = match source.topics.get(topic).map_err(read_err)? {
        Some(v) => decode::<TopicRecord>(&v)?.id,
        None => return Err(BrokerError::UnknownTopic(topic.to_owned()).into()),
    };
    let mut readable = 0;
    for seq in from..=to {
        if matches!(source.messages.get(msg_key(topic_id, seq)), Ok(Some(_))) {
            readable += 1;
        }
    }
    let rebuilt = data_dir.join("store.rebuilding");
    if rebuilt.exists() {
        std::fs::remove_dir_all(&rebuilt).map_err(|e| io("removing an old store.rebuilding", e))?;
    }
    rebuild(&source, &rebuilt, &HashMap::new(), |id, seq| {
        id == topic_id && (from..=to).contains(&seq)
    })?;
    drop(source);
    let kept = data_dir.join(format!("store.quarantined-{}", crate::broker::now_millis()));
    std::fs::rename(&store_dir, &kept).map_err(|e| io("moving the old store aside", e))?;
    std::fs::rename(&rebuilt, &store_dir).map_err(|e| io("moving the rebuilt store in", e))?;
    let done = Quarantined {
        topic: topic.to_owned(),
        from,
        to,
        readable,
        kept,
    };
    use std::io::Write;
    let mut log = File::options()
        .create(true)
        .append(true)
        .open(data_dir.join("quarantine-report.txt"))
        .map_err(|e| io("opening quarantine-report.txt", e))?;
    writeln!(log, "{}: {done}", time_now()).map_err(|e| io("writing the report", e))?;
    Ok(done)
}

/// Now, for reports: ms since the epoch.
fn time_now() -> String {
    format!("at {} ms since the epoch", crate::broker::now_millis())
}

/// Takes the data directory's lock (without creating it), so no daemon
/// starts while a tool runs; fails when a daemon holds it.
fn lock(data_dir: &Path) -> Result<Option<File>, ToolError> {
    if !data_dir.join("store").is_dir() {
        return Err(ToolError::NoStore(data_dir.to_owned()));
    }
    let path = data_dir.join(LOCK_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("opening {}", path.display()), e)),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(ToolError::InUse(data_dir.to_owned())),
        Err(std::fs::TryLockError::Error(e)) => Err(io(format!("locking {}", path.display()), e)),
    }
}

/// A scratch directory for a copy of a store, removed on drop.
struct Scratch {
    /// The copy.
    path: PathBuf,
}

impl Scratch {
    /// A fresh, empty one in the system's temp directory.
    fn new() -> Result<Scratch, ToolError> {
        let path = std::env::temp_dir().join(format!(
            "sluice-data-{}-{}",
            std::process::id(),
            crate::broker::now_millis()
        ));
        std::fs::create_dir_all(&path).map_err(|e| io("creating a scratch directory", e))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// An I/O error with what was being done.
fn io(what: impl Into<String>, source: std::io::Error) -> ToolError {
    ToolError::Io {
        what: what.into(),
        source,
    }
}

/// A read error of the store.
fn read_err(e: impl fmt::Display) -> BrokerError {
    BrokerError::Storage(format!("reading: {e}"))
}

/// The journals of `store_dir`.
fn read_journals(store_dir: &Path) -> Result<Vec<JournalFile>, ToolError> {
    journal::verify(store_dir).map_err(|e| {
        io(
            format!("reading the journals in {}", store_dir.display()),
            e,
        )
    })
}

/// Copies `src` into `dst` recursively.
fn copy_dir(src: &Path, dst: &Path) -> Result<(), ToolError> {
    std::fs::create_dir_all(dst).map_err(|e| io(format!("creating {}", dst.display()), e))?;
    for entry in std::fs::read_dir(src).map_err(|e| io(format!("listing {}", src.display()), e))? {
        let entry = entry.map_err(|e| io(format!("listing {}", src.display()), e))?;
        let to = dst.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &to)?;
        } else {
            std::fs::copy(entry.path(), &to)
                .map_err(|e| io(format!("copying {}", entry.path().display()), e))?;
        }
    }
    Ok(())
}

/// Names of topics and consumers by id, and keyspace names by fjall id.
struct Names {
    /// Topic records by id, with their names.
    topics: HashMap<u32, (String, TopicRecord)>,
    /// Consumer names by id.
    consumers: HashMap<u32, String>,
    /// Keyspace names by fjall id.
    keyspaces: HashMap<u64, &'static str>,
}

/// Reads the names (the small keyspaces must be readable for anything to
/// be reported by name).
fn names(store: &Store) -> Result<Names, BrokerError> {
    let mut topics = HashMap::new();
    for guard in store.topics.iter() {
        let (k, v) = guard.into_inner().map_err(read_err)?;
        let rec: TopicRecord = decode(&v)?;
        topics.insert(rec.id, (String::from_utf8_lossy(&k).into_owned(), rec));
    }
    let mut consumers = HashMap::new();
    for guard in store.consumers.iter() {
        let (k, v) = guard.into_inner().map_err(read_err)?;
        let rec: super::store::ConsumerRecord = decode(&v)?;
        consumers.insert(rec.id, String::from_utf8_lossy(&k).into_owned());
    }
    let keyspaces = store
        .keyspaces()
        .into_iter()
        .map(|(name, ks)| (ks.id(), name))
        .collect();
    Ok(Names {
        topics,
        consumers,
        keyspaces,
    })
}

/// The common part of the tools: verifies the journals, opens a copy of
/// the store cut at journal damage in `scratch`, reads every table.
/// Returns the report and the opened copy (None when it does not open).
fn examine(data_dir: &Path, scratch: &Path) -> Result<(Report, Option<Store>), ToolError> {
    let store_dir = data_dir.join("store");
    let journals = read_journals(&store_dir)?;
    let copy = scratch.join("store");
    copy_dir(&store_dir, &copy)?;
    let mut report = Report {
        data_dir: data_dir.to_owned(),
        ..Report::default()
    };
    for j in &journals {
        if let Some(d) = &j.damage {
            // Cut the copy where the damage starts, so fjall replays
            // exactly what precedes it.
            let name = j.path.file_name().unwrap_or_default();
            let f = File::options()
                .write(true)
                .open(copy.join(name))
                .map_err(|e| io("opening a journal copy", e))?;
            f.set_len(d.at)
                .map_err(|e| io("cutting a journal copy", e))?;
            if d.torn_tail {
                report.torn_tails.push(format!(
                    "{} from byte {} ({})",
                    j.path.display(),
                    d.at,
                    d.what
                ));
            }
        }
    }
    let store = match guard_panic(&copy, || Store::open_unchecked(&copy)) {
        Ok(store) => store,
        Err(e) => {
            report.damage.push(Finding {
                what: format!("{} does not open: {e}", store_dir.display()),
                touches: Vec::new(),
            });
            return Ok((report, None));
        }
    };
    let names = match guard_panic(&copy, || names(&store)) {
        Ok(names) => names,
        Err(e) => {
            report.damage.push(Finding {
                what: format!("the topic and consumer records cannot be read: {e}"),
                touches: vec![
                    Touch::Keyspace {
                        keyspace: "topics".into(),
                    },
                    Touch::Keyspace {
                        keyspace: "consumers".into(),
                    },
                ],
            });
            return Ok((report, Some(store)));
        }
    };
    for j in &journals {
        if let Some(d) = &j.damage
            && !d.torn_tail
        {
            report.damage.push(Finding {
                what: format!(
                    "journal {} is damaged at byte {} of {} ({}); {} valid batches follow it",
                    j.path.display(),
                    d.at,
                    j.len,
                    d.what,
                    d.after.len()
                ),
                touches: journal_touches(&names, &d.after),
            });
        }
    }
    // Every table: the messages per topic (so a damaged range is known by
    // seq), the rest per keyspace.
    let mut topic_list: Vec<_> = names.topics.iter().collect();
    topic_list.sort_by_key(|(id, _)| **id);
    for (id, (name, rec)) in topic_list {
        let scan = guard_panic(&copy, || {
            Ok(scan_topic(&store, *id, rec.last_seq, |_, _| Ok(())))
        })?;
        report.messages.insert(name.clone(), scan.read);
        for (from, to, why) in scan.damaged {
            report.damage.push(Finding {
                what: format!("a table block of topic {name} cannot be read: {why}"),
                touches: vec![Touch::Messages {
                    topic: name.clone(),
                    from,
                    to: Some(to),
                }],
            });
        }
    }
    for (name, ks) in store.keyspaces() {
        if name == "messages" {
            continue;
        }
        let result = guard_panic(&copy, || {
            for guard in ks.iter() {
                guard.into_inner().map_err(read_err)?;
            }
            Ok(())
        });
        if let Err(e) = result {
            report.damage.push(Finding {
                what: format!("keyspace {name} cannot be read in full: {e}"),
                touches: vec![Touch::Keyspace {
                    keyspace: name.into(),
                }],
            });
        }
    }
    Ok((report, Some(store)))
}

/// What the valid batches after a journal's damage wrote (lost with it),
/// plus the unreadable batch itself.
fn journal_touches(names: &Names, after: &[journal::Batch]) -> Vec<Touch> {
    let mut seqs: BTreeMap<u32, u64> = BTreeMap::new();
    let mut consumers = std::collections::BTreeSet::new();
    let mut other = std::collections::BTreeSet::new();
    for item in after.iter().flat_map(|b| &b.items) {
        let Some(ks) = names.keyspaces.get(&item.keyspace) else {
            continue;
        };
        let id = item
            .key
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_be_bytes);
        match (*ks, id) {
            ("messages", Some(id)) if item.insert => {
                if let Ok(seq) = key_seq(&item.key) {
                    let max = seqs.entry(id).or_default();
                    *max = (*max).max(seq);
                }
            }
            ("messages", _) => {}
            ("cursors" | "pending" | "settled", Some(id)) => {
                consumers.insert(
                    names
                        .consumers
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| format!("#{id}")),
                );
            }
            (ks, _) => {
                other.insert(ks);
            }
        }
    }
    let mut touches = Vec::new();
    let mut ids: Vec<_> = names.topics.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let (name, rec) = &names.topics[&id];
        // Seqs are assigned in order, so everything after the last seq the
        // readable part recorded is lost, up to the newest seq a later
        // batch shows; with no later batch, the unreadable batch may still
        // have held some.
        touches.push(Touch::Messages {
            topic: name.clone(),
            from: rec.last_seq + 1,
            to: seqs.get(&id).copied(),
        });
    }
    touches.extend(
        consumers
            .into_iter()
            .map(|consumer| Touch::Consumer { consumer }),
    );
    touches.extend(
        other
            .into_iter()
            .map(|k| Touch::Keyspace { keyspace: k.into() }),
    );
    touches
}

/// The newest lost seq per topic (from journal damage), which a rebuilt
/// store must never hand out again.
fn lost_last_seqs(report: &Report) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for t in report.damage.iter().flat_map(|d| &d.touches) {
        if let Touch::Messages {
            topic,
            to: Some(to),
            ..
        } = t
        {
            let e = out.entry(topic.clone()).or_insert(0);
            *e = (*e).max(*to);
        }
    }
    out
}

/// What reading one topic's messages found.
struct TopicScan {
    /// Messages read.
    read: u64,
    /// Seq ranges that could not be read, with the error.
    damaged: Vec<(u64, u64, String)>,
}

/// Reads topic `id`'s messages in order, calling `each` for every readable
/// one. A range scan stops at a damaged block; from there every seq up to
/// `last_seq` is read by itself, so the damaged range is known exactly.
fn scan_topic(
    store: &Store,
    id: u32,
    last_seq: u64,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), BrokerError>,
) -> TopicScan {
    let mut scan = TopicScan {
        read: 0,
        damaged: Vec::new(),
    };
    let mut next = 0u64;
    let mut failed = None;
    for guard in store.messages.range(msg_key(id, 0)..=msg_key(id, u64::MAX)) {
        match guard.into_inner() {
            Ok((k, v)) => {
                let Ok(seq) = key_seq(&k) else { continue };
                if each(seq, &v).is_err() {
                    failed = Some(format!("copying seq {seq} failed"));
                    break;
                }
                scan.read += 1;
                next = seq + 1;
            }
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let Some(_) = failed else {
        return scan;
    };
    let mut open: Option<(u64, u64, String)> = None;
    for seq in next..=last_seq.max(next) {
        match store.messages.get(msg_key(id, seq)) {
            Ok(found) => {
                if let Some(r) = open.take() {
                    scan.damaged.push(r);
                }
                if let Some(v) = found
                    && each(seq, &v).is_ok()
                {
                    scan.read += 1;
                }
            }
            Err(e) => match &mut open {
                Some((_, to, _)) => *to = seq,
                None => open = Some((seq, seq, e.to_string())),
            },
        }
    }
    scan.damaged.extend(open);
    scan
}

/// Writes a fresh store at `dst` with everything readable in `src` but the
/// messages `skip` names (and their pending entries), fixing each topic's
/// counters; `lost_last` raises a topic's last seq past seqs lost in a
/// journal, so they are never handed out again. Then opens it, to prove it
/// opens.
fn rebuild(
    src: &Store,
    dst: &Path,
    lost_last: &HashMap<String, u64>,
    skip: impl Fn(u32, u64) -> bool,
) -> Result<(), ToolError> {
    let new = Store::open(dst)?;
    let mut batch = new.db.batch();
    let mut pending_writes = 0usize;
    let flush = |batch: &mut fjall::OwnedWriteBatch, n: &mut usize| -> Result<(), BrokerError> {
        if *n > 0 {
            std::mem::replace(batch, new.db.batch())
                .commit()
                .map_err(|e| BrokerError::Storage(format!("writing the new store: {e}")))?;
            *n = 0;
        }
        Ok(())
    };
    let names = guard_panic(dst, || names(src))?;
    // Messages, per topic, with the counters rebuilt from what was copied.
    for (id, (name, rec)) in &names.topics {
        let mut first = None;
        let mut depth = 0u64;
        let mut last = rec.last_seq;
        let messages = new.messages.clone();
        let mut copy = |seq: u64, v: &[u8]| -> Result<(), BrokerError> {
            if skip(*id, seq) {
                return Ok(());
            }
            batch.insert(&messages, msg_key(*id, seq), v);
            pending_writes += 1;
            first.get_or_insert(seq);
            depth += 1;
            last = last.max(seq);
            Ok(())
        };
        guard_panic(dst, || Ok(scan_topic(src, *id, rec.last_seq, &mut copy)))?;
        flush(&mut batch, &mut pending_writes)?;
        if let Some(lost) = lost_last.get(name) {
            last = last.max(*lost);
        }
        // The delayed messages are copied below as they are: count what
        // can be read of them, so the counter matches the copy.
        let delayed = guard_panic(dst, || Ok(super::delayed::count(src, *id)))?;
        let fixed = TopicRecord {
            first_seq: first.unwrap_or(last + 1),
            last_seq: last,
            depth,
            delayed,
            ..rec.clone()
        };
        batch.insert(&new.topics, name.as_str(), encode(&fixed)?);
        pending_writes += 1;
    }
    // The other keyspaces as they are, but pending entries of skipped
    // messages; what cannot be read was reported by the check.
    let topic_of: HashMap<u32, u32> = {
        let mut m = HashMap::new();
        for guard in src.consumers.iter() {
            if let Ok((_, v)) = guard.into_inner()
                && let Ok(rec) = decode::<super::store::ConsumerRecord>(&v)
                && let Some((id, _)) = names.topics.iter().find(|(_, (n, _))| *n == rec.topic)
            {
                m.insert(rec.id, *id);
            }
        }
        m
    };
    for ((name, from), (_, to)) in src.keyspaces().into_iter().zip(new.keyspaces()) {
        if matches!(name, "messages" | "topics") {
            continue;
        }
        let _ = guard_panic(dst, || {
            for guard in from.iter() {
                let Ok((k, v)) = guard.into_inner() else {
                    break;
                };
                if name == "pending"
                    && let (Some(cid), Ok(seq)) = (
                        k.get(..4)
                            .and_then(|b| <[u8; 4]>::try_from(b).ok())
                            .map(u32::from_be_bytes),
                        key_seq(&k),
                    )
                    && topic_of.get(&cid).is_some_and(|tid| skip(*tid, seq))
                {
                    continue;
                }
                batch.insert(to, k, v);
                pending_writes += 1;
                if pending_writes >= 10_000 {
                    flush(&mut batch, &mut pending_writes)?;
                }
            }
            Ok(())
        });
    }
    flush(&mut batch, &mut pending_writes)?;
    new.db
        .persist(fjall::PersistMode::SyncAll)
        .map_err(|e| BrokerError::Storage(format!("syncing the new store: {e}")))?;
    recover::load(&new)?;
    Ok(())
}
