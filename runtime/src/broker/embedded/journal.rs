//! Read-only verification of the store's journal files (`store/*.jnl`),
//! run before fjall opens them.
//!
//! fjall (3.1) replays a journal until the first entry it cannot decode and
//! then truncates the file there, whatever follows: one flipped byte in the
//! middle silently drops every later batch (and with it acknowledged
//! messages), and some damage makes it panic. It has no strict recovery
//! mode (its `RecoveryMode` has only `TolerateCorruptTail`), so this module
//! reads the files itself, never writing, and tells the two cases apart:
//!
//! - a **torn tail**: the newest journal ends in an incomplete batch and no
//!   valid batch follows it. That is the write a crash interrupted (it was
//!   never acknowledged), and fjall may drop it;
//! - **damage**: anything else, above all a bad batch followed by valid
//!   ones. Opening must refuse, naming the file and the offset.
//!
//! The format (fjall `journal/entry.rs`, `writer.rs`): a batch is a Start
//! entry (tag 1, item count u32, seqno u64), that many Item (tag 2) or
//! Clear (tag 4) entries, and an End entry (tag 3, xxh3 checksum of the
//! encoded items u64, trailer `FJL\x03`). Integers are little-endian. A new
//! journal is preallocated with zeros, so a run of zeros ends the data.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

/// Tag of a batch start.
const TAG_START: u8 = 1;
/// Tag of an item.
const TAG_ITEM: u8 = 2;
/// Tag of a batch end.
const TAG_END: u8 = 3;
/// Tag of a keyspace clear.
const TAG_CLEAR: u8 = 4;
/// The trailer after an End entry's checksum.
const TRAILER: &[u8] = b"FJL\x03";
/// Bytes of an item's fixed header: tag, value type, compression,
/// keyspace id, key length, value length, stored value length.
const ITEM_HEADER: usize = 1 + 1 + 1 + 8 + 2 + 4 + 4;
/// Consecutive batches of one journal with seqnos further apart than this
/// are damage (a flipped seqno; the Start entry is outside the checksum).
const MAX_SEQNO_GAP: u64 = 1 << 24;

/// One journal file, as read.
#[derive(Debug, Clone)]
pub struct JournalFile {
    /// The file.
    pub path: PathBuf,
    /// Its size on disk.
    pub len: u64,
    /// Whether it is the newest journal (the one being written).
    pub active: bool,
    /// Valid batches before any damage.
    pub batches: usize,
    /// End of the last valid batch before any damage.
    pub valid_end: u64,
    /// What is wrong, if anything.
    pub damage: Option<Damage>,
}

/// Damage found in a journal.
#[derive(Debug, Clone)]
pub struct Damage {
    /// Offset of the first bad batch.
    pub at: u64,
    /// What is wrong there.
    pub what: String,
    /// Whether it is only a torn tail (fjall may drop it safely).
    pub torn_tail: bool,
    /// The valid batches after the damage, which fjall would drop.
    pub after: Vec<Batch>,
}

/// A decoded batch: where it is and what it wrote.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Offset of its Start entry.
    pub start: u64,
    /// Its fjall seqno.
    pub seqno: u64,
    /// What each item wrote.
    pub items: Vec<Item>,
}

/// One item of a batch, without its value.
#[derive(Debug, Clone)]
pub struct Item {
    /// fjall's keyspace id.
    pub keyspace: u64,
    /// Whether it is an insert (not a deletion).
    pub insert: bool,
    /// The key.
    pub key: Vec<u8>,
}

impl JournalFile {
    /// Why opening must refuse, if it must.
    pub fn refusal(&self) -> Option<String> {
        let d = self.damage.as_ref()?;
        if d.torn_tail {
            return None;
        }
        Some(format!(
            "journal {} is damaged at byte {} of {} ({}); {} valid batches follow the damage, \
             which the storage library would silently drop",
            self.path.display(),
            d.at,
            self.len,
            d.what,
            d.after.len()
        ))
    }
}

/// Reads every journal in `store_dir` (fjall's directory), oldest first.
/// Changes nothing.
///
/// # Errors
///
/// When a journal cannot be listed or read.
pub fn verify(store_dir: &Path) -> std::io::Result<Vec<JournalFile>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(store_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jnl"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        files.push((id, path));
    }
    files.sort();
    let newest = files.last().map(|(id, _)| *id);
    files
        .into_iter()
        .map(|(id, path)| {
            let (bytes, len) = read_data(&path)?;
            let mut j = read_journal(path, &bytes, Some(id) == newest);
            j.len = len;
            Ok(j)
        })
        .collect()
}

/// The bytes of a journal up to where its trailing hole starts (a new
/// journal is preallocated sparse, 64 MiB), and the file's length. What
/// is left out reads as zeros, which end the data anyway. Where the file
/// system cannot tell holes, the whole file is read.
fn read_data(path: &Path) -> std::io::Result<(Vec<u8>, u64)> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let end = data_end(&file, len);
    // The probes moved the file offset.
    file.seek(std::io::SeekFrom::Start(0))?;
    let mut bytes = Vec::with_capacity(usize::try_from(end).unwrap_or(0));
    (&mut file).take(end).read_to_end(&mut bytes)?;
    Ok((bytes, len))
}

/// Where the trailing hole of `file` (of length `len`) starts; `len` when
/// unknown.
#[cfg(target_os = "linux")]
fn data_end(file: &std::fs::File, len: u64) -> u64 {
    use rustix::fs::{SeekFrom, seek};
    let mut end = 0;
    let mut pos = 0;
    while pos < len {
        let data = match seek(file, SeekFrom::Data(pos)) {
            Ok(data) => data,
            // No data past `pos`: the rest is the hole.
            Err(rustix::io::Errno::NXIO) => return end,
            Err(_) => return len,
        };
        match seek(file, SeekFrom::Hole(data)) {
            Ok(hole) if hole > data => {
                end = hole.min(len);
                pos = hole;
            }
            _ => return len,
        }
    }
    end
}

/// Where the trailing hole starts: unknown here, so the whole file.
#[cfg(not(target_os = "linux"))]
fn data_end(_file: &std::fs::File, len: u64) -> u64 {
    len
}

/// Why a batch does not decode.
struct Bad(String);

/// Walks one journal's bytes.
fn read_journal(path: PathBuf, buf: &[u8], active: bool) -> JournalFile {
    let len = buf.len() as u64;
    let mut pos = 0usize;
    let mut batches = 0usize;
    let mut prev_seqno: Option<u64> = None;
    let mut damage = None;
    while pos < buf.len() {
        if buf[pos] == 0 && all_zero(&buf[pos..]) {
            break; // preallocated space
        }
        match parse_batch(buf, pos, false) {
            Ok((batch, end)) if seqno_plausible(prev_seqno, batch.seqno) => {
                prev_seqno = Some(batch.seqno);
                batches += 1;
                pos = end;
            }
            Ok((batch, _)) => {
                let what = format!(
                    "batch seqno {} after seqno {}: a damaged batch header",
                    batch.seqno,
                    prev_seqno.unwrap_or_default()
                );
                damage = Some(damaged_at(buf, pos, what, active));
                break;
            }
            Err(Bad(what)) => {
                damage = Some(damaged_at(buf, pos, what, active));
                break;
            }
        }
    }
    JournalFile {
        path,
        len,
        active,
        batches,
        valid_end: pos as u64,
        damage,
    }
}

/// Reads `bytes` as a journal both ways the tools do (`check` and
/// `salvage`), checking what the reader reports: the fuzz target.
#[cfg(feature = "fuzz")]
pub(crate) fn walk(bytes: &[u8]) {
    for active in [false, true] {
        let file = read_journal(PathBuf::from("fuzz.jnl"), bytes, active);
        assert!(file.valid_end <= file.len, "valid end past the file's end");
        if let Some(damage) = &file.damage {
            assert_eq!(damage.at, file.valid_end, "damage away from the valid end");
            assert!(
                damage.after.iter().all(|b| b.start > damage.at),
                "a batch after the damage starts before it"
            );
        }
        let _ = file.refusal();
    }
    let mut pos = 0;
    while pos < bytes.len() {
        match parse_batch(bytes, pos, true) {
            Ok((_, end)) => {
                assert!(end > pos && end <= bytes.len(), "a batch that ends nowhere");
                pos = end;
            }
            Err(_) => break,
        }
    }
}

/// Whether `bytes` are all zero (a new journal's preallocated space, up
/// to 64 MiB): compared a page at a time, so it is a memcmp even in a
/// debug build.
fn all_zero(bytes: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    bytes.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

/// Whether `seqno` can follow `prev` in one journal.
fn seqno_plausible(prev: Option<u64>, seqno: u64) -> bool {
    prev.is_none_or(|p| seqno.abs_diff(p) <= MAX_SEQNO_GAP)
}

/// The damage at `at`: finds the valid batches after it (any one makes it
/// more than a torn tail).
fn damaged_at(buf: &[u8], at: usize, what: String, active: bool) -> Damage {
    let mut after = Vec::new();
    let mut q = at + 1;
    while q < buf.len() {
        if buf[q] == TAG_START
            && let Ok((batch, end)) = parse_batch(buf, q, true)
        {
            after.push(batch);
            q = end;
        } else {
            q += 1;
        }
    }
    // A sealed journal was fsynced whole before the next one began, so even
    // an incomplete batch at its end is damage, not a torn write.
    let torn_tail = after.is_empty() && active;
    Damage {
        at: at as u64,
        what,
        torn_tail,
        after,
    }
}

/// Decodes the batch starting at `pos`; returns it and where it ends.
fn parse_batch(buf: &[u8], pos: usize, keep_keys: bool) -> Result<(Batch, usize), Bad> {
    let mut c = Cursor { buf, pos };
    let tag = c.u8()?;
    if tag != TAG_START {
        return Err(Bad(format!("entry tag {tag} where a batch should start")));
    }
    let count = c.u32()? as usize;
    let seqno = c.u64()?;
    // Every entry takes at least 9 bytes, so a count the file cannot hold
    // is a damaged header (and must not drive a long loop).
    if count == 0 || count > buf.len().saturating_sub(c.pos) / 9 {
        return Err(Bad(format!("batch header claims {count} items")));
    }
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut items = Vec::new();
    for i in 0..count {
        let start = c.pos;
        match c.u8()? {
            TAG_ITEM => {
                let value_type = c.u8()?;
                if !matches!(value_type, 0 | 1 | 2 | 4) {
                    return Err(Bad(format!("item {i} has value type {value_type}")));
                }
                let compression = c.u8()?;
                if compression > 1 {
                    return Err(Bad(format!("item {i} has compression tag {compression}")));
                }
                let keyspace = c.u64()?;
                let key_len = c.u16()? as usize;
                let value_len = c.u32()?;
                let stored_len = c.u32()?;
                if compression == 0 && value_len != stored_len {
                    return Err(Bad(format!("item {i} has inconsistent lengths")));
                }
                debug_assert_eq!(c.pos - start, ITEM_HEADER);
                let key = c.take(key_len)?;
                c.take(stored_len as usize)?;
                if keep_keys {
                    items.push(Item {
                        keyspace,
                        insert: value_type == 0,
                        key: key.to_vec(),
                    });
                }
            }
            TAG_CLEAR => {
                c.u64()?;
            }
            TAG_END => {
                return Err(Bad(format!(
                    "batch ends after {i} of {count} items (insufficient length)"
                )));
            }
            tag => return Err(Bad(format!("entry tag {tag} inside a batch"))),
        }
        hasher.update(&buf[start..c.pos]);
    }
    let tag = c.u8()?;
    if tag != TAG_END {
        return Err(Bad(format!(
            "entry tag {tag} where the end of a {count}-item batch should be"
        )));
    }
    let checksum = c.u64()?;
    if c.take(TRAILER.len())? != TRAILER {
        return Err(Bad("batch end without its trailer".into()));
    }
    if hasher.finish() != checksum {
        return Err(Bad("checksum mismatch".into()));
    }
    Ok((
        Batch {
            start: pos as u64,
            seqno,
            items,
        },
        c.pos,
    ))
}

/// Little-endian reads from a byte slice; running out is a [`Bad`].
struct Cursor<'a> {
    /// The file.
    buf: &'a [u8],
    /// The read position.
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| Bad("incomplete batch (the file ends inside it)".into()))?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    /// A fixed-size array.
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Bad> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A u8.
    fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.array::<1>()?[0])
    }

    /// A u16, little-endian.
    fn u16(&mut self) -> Result<u16, Bad> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A u32, little-endian.
    fn u32(&mut self) -> Result<u32, Bad> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A u64, little-endian.
    fn u64(&mut self) -> Result<u64, Bad> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes a one-item batch as fjall's writer does.
    fn batch(seqno: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut item = vec![TAG_ITEM, 0, 0];
        item.extend_from_slice(&3u64.to_le_bytes());
        item.extend_from_slice(&(key.len() as u16).to_le_bytes());
        item.extend_from_slice(&(value.len() as u32).to_le_bytes());
        item.extend_from_slice(&(value.len() as u32).to_le_bytes());
        item.extend_from_slice(key);
        item.extend_from_slice(value);
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&item);
        let mut out = vec![TAG_START];
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&seqno.to_le_bytes());
        out.extend_from_slice(&item);
        out.push(TAG_END);
        out.extend_from_slice(&h.finish().to_le_bytes());
        out.extend_from_slice(TRAILER);
        out
    }

    fn journal(n: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        for i in 0..n {
            buf.extend(batch(i + 1, format!("key{i}").as_bytes(), &[7u8; 40]));
        }
        buf
    }

    #[test]
    fn a_clean_journal_with_preallocated_zeros_is_clean() {
        let mut buf = journal(50);
        buf.extend(vec![0u8; 4096]);
        let j = read_journal("0.jnl".into(), &buf, true);
        assert_eq!(j.batches, 50);
        assert!(j.damage.is_none());
    }

    #[test]
    fn a_torn_tail_is_tolerated_but_mid_journal_damage_is_not() {
        let buf = journal(50);
        let cut = &buf[..buf.len() - 10];
        let torn = read_journal("0.jnl".into(), cut, true);
        assert!(torn.refusal().is_none(), "{torn:?}");
        assert_eq!(torn.batches, 49);
        // The same in a sealed journal is damage.
        assert!(read_journal("0.jnl".into(), cut, false).refusal().is_some());

        for pct in [10, 30, 50, 70, 90] {
            let mut bad = buf.clone();
            let at = bad.len() * pct / 100;
            for b in &mut bad[at..at + 16] {
                *b ^= 0xff;
            }
            let j = read_journal("0.jnl".into(), &bad, true);
            let why = j.refusal().unwrap_or_else(|| panic!("{pct}%: not refused"));
            assert!(why.contains("0.jnl"), "{why}");
            let d = j.damage.as_ref().map(|d| d.after.len()).unwrap_or(0);
            assert!(d > 0, "{pct}%");
        }
    }
}
