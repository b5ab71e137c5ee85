//! What every server fixture does with its process: find a free port,
//! stop it and wait (killing it past a deadline), kill it when dropped.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::Context;

/// How often a stopping process is checked for its exit.
const POLL: Duration = Duration::from_millis(50);

/// A loopback port nobody listens on now.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Sends SIGTERM to `child` and [`reap`]s it.
pub fn terminate(child: Child, within: Duration) -> bool {
    let pid = rustix::process::Pid::from_child(&child);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    reap(child, within)
}

/// Waits for a stopping `child` to exit; past `within`, kills it. True
/// when it exited by itself.
pub fn reap(mut child: Child, within: Duration) -> bool {
    let exited = wait_exit(&mut child, within);
    if !exited {
        kill(child);
    }
    exited
}

/// Waits at most `within` for `child` to exit; true when it did.
pub fn wait_exit(child: &mut Child, within: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(POLL);
    }
    false
}

/// Kills `child` (SIGKILL) and reaps it: what a fixture does when it is
/// dropped, also after a test panicked.
pub fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}
