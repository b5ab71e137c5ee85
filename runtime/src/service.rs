//! The service manager's side of the daemon: systemd's notify protocol
//! (`Type=notify` in `deploy/systemd/sluice.service`).
//!
//! Everything here is a no-op unless the service manager asked for it by
//! setting `NOTIFY_SOCKET` (and `WATCHDOG_USEC` for the watchdog), so the
//! same binary runs the same way from a shell, a container or a test.
//!
//! - `READY=1` once the stages run and the admin API answers, so units
//!   ordered after `sluice.service` start against a working daemon;
//! - `RELOADING=1` while a reload runs, then `READY=1` again with a status
//!   that says whether it was applied;
//! - `STOPPING=1` when a signal starts the drain, so systemd waits for it
//!   (within `TimeoutStopSec`) instead of calling the daemon hung;
//! - `WATCHDOG=1` at half the interval systemd asked for, from a task on
//!   the daemon's own runtime: a runtime that stops scheduling stops the
//!   pings, and systemd restarts the daemon.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells the service manager that the daemon is up, with a one-line
/// `status` that `systemctl status` shows.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager that a reload began; [`ready`] ends it.
/// `MONOTONIC_USEC` goes with it, as `Type=notify-reload` units need.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[
            NotifyState::Reloading,
            now,
            NotifyState::Status("reloading"),
        ]),
        Err(_) => send(&[NotifyState::Reloading, NotifyState::Status("reloading")]),
    }
}

/// Tells the service manager that the daemon is draining before it exits.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

/// Starts the watchdog pings when the service manager asked for them
/// (`WatchdogSec=` sets `WATCHDOG_USEC`; a `WATCHDOG_PID` of another
/// process means they are not for this one). Must be called on the
/// runtime; the task runs until the runtime ends.
pub fn spawn_watchdog() {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    // Half the interval, as sd_watchdog_enabled(3) advises: one late ping
    // on a loaded machine must not get the daemon killed.
    let every = (interval / 2).max(Duration::from_millis(10));
    tracing::info!(interval = ?interval, "systemd watchdog on; pinging every {every:?}");
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            send(&[NotifyState::Watchdog]);
        }
    });
}

/// Sends `states`; a failure is logged, never fatal: the daemon works the
/// same without a service manager, and systemd reports a missing `READY=1`
/// itself.
fn send(states: &[NotifyState<'_>]) {
    if let Err(err) = sd_notify::notify(states) {
        tracing::warn!(error = %err, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
