//! The process's own gauges, read from `/proc`: resident memory, open
//! descriptors, and when the process started. On other systems the first
//! two stay at zero and the start time is when the metrics were registered.

use super::Metrics;

impl Metrics {
    /// Reads the process gauges (resident memory, open descriptors) from
    /// `/proc`; on other systems they stay at zero.
    pub fn refresh_process(&self) {
        if let Some(rss) = resident_memory_bytes() {
            self.resident_memory
                .set(i64::try_from(rss).unwrap_or(i64::MAX));
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // One entry is the directory handle read_dir itself holds.
            let n = entries.count().saturating_sub(1);
            self.open_fds.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// The resident set size, from `/proc/self/status` (`VmRSS`, in kB).
fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// When this process started, in seconds since the Unix epoch: its start
/// in clock ticks after boot (`/proc/self/stat`) plus the boot time
/// (`/proc/stat`), at the usual 100 ticks a second; else now.
pub(super) fn process_start_time() -> f64 {
    let from_proc = || -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses.
        let after = stat.rsplit_once(')')?.1;
        let ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let btime: f64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(btime + ticks / 100.0)
    };
    from_proc().unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    })
}
