//! Time for the sandbox's deadlines: a thread advances wasmtime's epoch
//! and a tick counter together ([`EpochTicker`]); deadlines are counted in
//! those ticks ([`TickClock`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::Engine;

/// Time as the epoch ticker sees it: the number of ticks so far.
///
/// Deadlines are kept in ticks rather than `Instant`s because the hot path
/// then reads an atomic instead of the system clock on every call, and the
/// epoch callback that enforces them only runs on a tick anyway.
#[derive(Clone, Debug)]
pub(crate) struct TickClock {
    ticks: Arc<AtomicU64>,
    tick: Duration,
}

impl TickClock {
    pub(super) fn new(tick: Duration) -> Self {
        TickClock {
            ticks: Arc::default(),
            tick: tick.max(Duration::from_millis(1)),
        }
    }

    /// Ticks so far.
    pub(crate) fn now(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }

    /// The first tick at which `timeout` has certainly passed since now: one
    /// extra tick covers starting just before a tick, so a call is never cut
    /// short, and is at most one tick late.
    pub(crate) fn deadline_after(&self, timeout: Duration) -> u64 {
        let ticks = timeout.as_nanos().div_ceil(self.tick.as_nanos());
        self.now()
            .saturating_add(u64::try_from(ticks).unwrap_or(u64::MAX))
            .saturating_add(1)
    }
}

/// Advances the engine's epoch and the [`TickClock`] every tick on a
/// dedicated thread, until dropped.
pub(super) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    pub(super) fn start(engine: Engine, clock: TickClock) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(clock.tick);
                    clock.ticks.fetch_add(1, Ordering::Relaxed);
                    engine.increment_epoch();
                }
            })?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
