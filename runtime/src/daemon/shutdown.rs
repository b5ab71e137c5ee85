//! The daemon's shutdown: sources stop first, then the stages drain, then
//! the claim sweeper, the admin server and the broker's flush, each within
//! the shutdown deadline.

use std::sync::Arc;

use super::{AdminServer, DaemonError, Sweeper, reload};
use crate::broker::Broker;

/// Drains and stops everything in order: sources, stages, the sweeper,
/// the admin server, then the broker's flush.
///
/// The whole shutdown keeps the longest `shutdown_timeout` (plus
/// FLUSH_GRACE): the stages keep their own deadlines, and every step
/// after them is bounded, so a dead broker cannot hold the exit.
pub(super) async fn shut_down(
    live: reload::Live,
    sweeper: Sweeper,
    admin: AdminServer,
    broker: &Arc<dyn Broker>,
) -> Result<(), DaemonError> {
    let reload::Live {
        engine,
        mut sources,
        pipelines,
        ..
    } = live;
    let deadline = tokio::time::Instant::now()
        + pipelines
            .iter()
            .map(|p| p.shutdown_timeout.get())
            .max()
            .unwrap_or_default();
    tracing::info!("shutting down: draining stages");
    // Ingest answers 503 (and readiness says draining) from now on; the
    // server stays up to say so until the stages have drained.
    admin.state.start_draining();
    // Sources first: nothing new enters while the stages drain. A read
    // being published finishes (and is acked upstream) or is given back.
    if !sources.stop(None, deadline).await {
        tracing::warn!(
            "a source did not stop by the shutdown deadline; what it read and did not acknowledge is read again after a restart"
        );
    }
    engine.shutdown().await;
    let _ = sweeper.stop.send(true);
    // A step that starts at or past the deadline still gets a moment.
    let bound = |grace| deadline.max(tokio::time::Instant::now()) + grace;
    if let Some(task) = sweeper.task
        && tokio::time::timeout_at(bound(FLUSH_GRACE / 4), task)
            .await
            .is_err()
    {
        tracing::warn!("the claim sweeper did not stop by the shutdown deadline; abandoning it");
    }
    for task in sweeper.archivers {
        // A pass in hand finishes (its object written, its messages
        // removed) or is abandoned whole: what it had not removed stays.
        if tokio::time::timeout_at(bound(FLUSH_GRACE / 4), task)
            .await
            .is_err()
        {
            tracing::warn!("a retention archiver did not stop by the shutdown deadline");
        }
    }
    let _ = admin.stop.send(());
    let admin_result = tokio::time::timeout_at(bound(FLUSH_GRACE / 2), admin.task).await;
    match tokio::time::timeout_at(bound(FLUSH_GRACE), broker.flush()).await {
        Ok(flushed) => flushed?,
        Err(_) => tracing::warn!(
            "the broker did not finish flushing by the shutdown deadline; what it had not made durable is redelivered after a restart"
        ),
    }
    tracing::info!("stopped");
    match admin_result {
        Ok(Ok(Ok(()))) => Ok(()),
        Err(_) => {
            tracing::warn!(
                "the admin server did not close by the shutdown deadline; abandoning its connections"
            );
            Ok(())
        }
        Ok(Ok(Err(err))) => Err(DaemonError::Admin(err)),
        Ok(Err(err)) => Err(DaemonError::Admin(std::io::Error::other(err))),
    }
}

/// How long past the shutdown deadline the broker's final flush may take
/// (the sweeper's stop a quarter, the admin server's close half of it). A flush of the embedded broker is one
/// fsync; a NATS connection that cannot flush by then is not waited for.
const FLUSH_GRACE: std::time::Duration = std::time::Duration::from_secs(1);
