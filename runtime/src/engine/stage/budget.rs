//! What a stage may hold at once: one in-flight permit per unsettled
//! delivery (at most `max_in_flight`), and the delivery's bytes from the
//! byte budget ([`IN_FLIGHT_BYTES`]). A [`Job`](super::Job) carries both
//! permits until it is settled, so nothing here needs to be told when.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[cfg(doc)]
use super::IN_FLIGHT_BYTES;
use crate::broker::Delivery;

/// The in-flight permits and the byte budget of one stage.
pub(super) struct Budget {
    max_in_flight: usize,
    /// The most bytes it holds.
    max_bytes: usize,
    /// Unsettled deliveries.
    in_flight: Arc<Semaphore>,
    /// Bytes of unsettled deliveries.
    bytes: Arc<Semaphore>,
    /// The size a fetch assumes per message: the recent largest, decaying.
    typical_size: AtomicUsize,
}

impl Budget {
    /// A budget of `max_in_flight` deliveries and `max_bytes` bytes (at
    /// least one byte; [`IN_FLIGHT_BYTES`] but for an object-store sink).
    pub(super) fn new(max_in_flight: usize, max_bytes: usize) -> Budget {
        let max_bytes = max_bytes.max(1);
        Budget {
            max_in_flight,
            max_bytes,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            bytes: Arc::new(Semaphore::new(max_bytes)),
            // Unknown yet: the first fetches are small until sizes are seen.
            typical_size: AtomicUsize::new(max_bytes / 16),
        }
    }

    /// Waits for in-flight permits, then takes as many more as are free, up
    /// to `per_fetch`. When every permit is taken (the stage is saturated)
    /// it waits for a chunk of them rather than one: each fetch is a broker
    /// round trip, and fetching one message per settled one would spend
    /// the stage's time on round trips. The chunk is at most a quarter of
    /// the in-flight limit, so the rest stays busy meanwhile. Then as many
    /// as the free bytes fit at the recent message size (at least one: a
    /// message larger than the budget still runs).
    pub(super) async fn reserve(&self, per_fetch: usize) -> Vec<OwnedSemaphorePermit> {
        let want = per_fetch.min(self.max_in_flight);
        let mut permits = Vec::with_capacity(want);
        let chunk = if self.in_flight.available_permits() == 0 {
            (self.max_in_flight / 4).clamp(1, 32).min(want)
        } else {
            1
        };
        let chunk = u32::try_from(chunk).unwrap_or(1);
        if let Ok(mut taken) = self.in_flight.clone().acquire_many_owned(chunk).await {
            while let Some(one) = taken.split(1) {
                permits.push(one);
            }
        }
        while permits.len() < want {
            match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let typical = self.typical_size.load(Ordering::Relaxed).max(1);
        let fits = (self.bytes.available_permits() / typical).max(1);
        permits.truncate(fits);
        permits
    }

    /// The bytes free now: what a fetch may ask for.
    pub(super) fn free_bytes(&self) -> usize {
        self.bytes.available_permits()
    }

    /// `delivery`'s bytes, if they are free now.
    pub(super) fn try_take_bytes(&self, delivery: &Delivery) -> Option<OwnedSemaphorePermit> {
        self.bytes
            .clone()
            .try_acquire_many_owned(footprint(delivery, self.max_bytes))
            .ok()
    }

    /// `delivery`'s bytes, once they are free (`None` only if the budget
    /// were closed, which it never is).
    pub(super) async fn take_bytes(&self, delivery: &Delivery) -> Option<OwnedSemaphorePermit> {
        self.bytes
            .clone()
            .acquire_many_owned(footprint(delivery, self.max_bytes))
            .await
            .ok()
    }

    /// Updates the size a fetch assumes per message: the largest just
    /// fetched, or half the previous figure, whichever is larger, so a
    /// run of large messages shrinks fetches at once and small ones
    /// grow them back within a few fetches.
    pub(super) fn learn_sizes(&self, deliveries: &[Delivery]) {
        if let Some(largest) = deliveries
            .iter()
            .map(|d| footprint(d, self.max_bytes) as usize)
            .max()
        {
            let before = self.typical_size.load(Ordering::Relaxed);
            self.typical_size
                .store(largest.max(before / 2), Ordering::Relaxed);
        }
    }
}

/// What a delivery counts against the byte budget: what it holds in
/// memory, capped at the budget so that one larger message still runs
/// (alone).
fn footprint(delivery: &Delivery, max_bytes: usize) -> u32 {
    let bytes = delivery.message.size();
    u32::try_from(bytes.min(max_bytes)).unwrap_or(u32::MAX)
}
