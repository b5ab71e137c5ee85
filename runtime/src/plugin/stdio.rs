//! A plugin's stdout and stderr, and its log budget.
//!
//! Guests written in any language print; a sandbox that failed their writes
//! would make ordinary `println!` panic. So output is accepted, split into
//! lines and forwarded to `tracing` inside the current stage/message span,
//! and everything past the per-call budget is counted and dropped rather
//! than buffered: a chatty or hostile plugin cannot grow the host's memory or
//! flood its logs.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// The longest line forwarded as one log event; longer lines are split.
const MAX_LINE: usize = 4096;
/// How many of the first stderr lines of a call are kept to explain a
/// trap: where a JavaScript or Python guest prints its error message.
const STDERR_HEAD_LINES: usize = 3;
/// How many of the last stderr lines are kept too: where a Rust panic's
/// message is, and a runtime's last words (`Redirecting call to abort()`).
const STDERR_TAIL_LINES: usize = 3;
/// How much of each kept stderr line.
const STDERR_TAIL_LINE_BYTES: usize = 300;

/// What to do about a trap whose stderr shows a known toolchain failing to
/// lower a handler's return value into the contract's result type: the
/// toolchains' own words ("invalid variant", "unreachable") do not say that
/// the handler returned the wrong shape, nor how to return the right one.
pub(crate) fn trap_hint(stderr: &str) -> Option<&'static str> {
    if stderr.contains("invalid variant specified for result") {
        Some(
            "a JavaScript handler on the raw bindings must return { tag: \"ok\", val: [emits] } \
             or { tag: \"err\", val: { tag: \"reject\", val: reason } }; with the SDK (sluice.js) \
             it returns its emits and throws Reject or Retry",
        )
    } else if stderr.contains("entered unreachable code") && stderr.contains("runtime/src/lib.rs") {
        Some(
            "componentize-py traps this way when a Python handler on the raw bindings returns \
             something other than Ok([emits]) or Err(HandlerError_...); with the SDK (sluice.py) \
             it returns its emits and raises Reject or Retry",
        )
    } else {
        None
    }
}

/// How many log bytes a plugin may still write during the current call.
/// Shared by the `log` import and both output streams.
/// It also keeps the first and the last few stderr lines of the call
/// (whatever the budget), because that is where a guest's error message,
/// panic or traceback is, and a trap without it is hard to act on.
#[derive(Clone, Debug, Default)]
pub(crate) struct LogBudget {
    remaining: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
    stderr_tail: Arc<Mutex<Excerpt>>,
    /// Whether `stderr_tail` holds anything, so the per-call reset can skip the lock.
    has_tail: Arc<std::sync::atomic::AtomicBool>,
}

impl LogBudget {
    /// Starts a new call with `bytes` of budget; returns what the previous
    /// call dropped.
    pub(crate) fn reset(&self, bytes: usize) -> usize {
        self.remaining.store(bytes, Ordering::Relaxed);
        if self.has_tail.swap(false, Ordering::Relaxed)
            && let Ok(mut tail) = self.stderr_tail.lock()
        {
            tail.clear();
        }
        self.dropped.swap(0, Ordering::Relaxed)
    }

    /// The first and last lines the guest wrote to stderr during this
    /// call, joined, with how many were left out between them.
    pub(crate) fn stderr_tail(&self) -> Option<String> {
        self.stderr_tail.lock().ok()?.render()
    }

    fn remember_stderr(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(&line[..line.len().min(STDERR_TAIL_LINE_BYTES)]);
        let text = text.trim();
        // Rust guests end every panic with a hint about an environment
        // variable the sandbox does not pass; it only hides the message.
        if text.is_empty() || text.starts_with("note: run with `RUST_BACKTRACE") {
            return;
        }
        if let Ok(mut excerpt) = self.stderr_tail.lock() {
            excerpt.push(text.to_owned());
            self.has_tail.store(true, Ordering::Relaxed);
        }
    }

    /// Takes up to `wanted` bytes; returns how many may be written.
    pub(crate) fn take(&self, wanted: usize) -> usize {
        let mut granted = 0;
        let _ = self
            .remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                granted = left.min(wanted);
                Some(left - granted)
            });
        if granted < wanted {
            self.dropped.fetch_add(wanted - granted, Ordering::Relaxed);
        }
        granted
    }
}

/// The first [`STDERR_HEAD_LINES`] and last [`STDERR_TAIL_LINES`] stderr
/// lines of a call, and how many fell between them: bounded, however much
/// the guest writes.
#[derive(Debug, Default)]
struct Excerpt {
    head: Vec<String>,
    tail: VecDeque<String>,
    skipped: usize,
}

impl Excerpt {
    fn push(&mut self, line: String) {
        if self.head.len() < STDERR_HEAD_LINES {
            self.head.push(line);
            return;
        }
        if self.tail.len() == STDERR_TAIL_LINES {
            self.tail.pop_front();
            self.skipped += 1;
        }
        self.tail.push_back(line);
    }

    fn clear(&mut self) {
        self.head.clear();
        self.tail.clear();
        self.skipped = 0;
    }

    fn render(&self) -> Option<String> {
        if self.head.is_empty() {
            return None;
        }
        let mut parts: Vec<String> = self.head.clone();
        if self.skipped > 0 {
            let lines = if self.skipped == 1 { "line" } else { "lines" };
            parts.push(format!("[{} more {lines}]", self.skipped));
        }
        parts.extend(self.tail.iter().cloned());
        Some(parts.join(" / "))
    }
}

/// Where a guest's stdout or stderr goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// Hands WASI a fresh line-splitting writer whenever the guest opens its
/// stdout or stderr.
pub(crate) struct GuestOutputFactory {
    pub(crate) plugin: Arc<str>,
    pub(crate) stream: Stream,
    pub(crate) budget: LogBudget,
    /// Whose values never reach the log or the stderr tail.
    pub(crate) secrets: super::GuestSecrets,
}

impl IsTerminal for GuestOutputFactory {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutputFactory {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.writer())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.writer())
    }
}

impl GuestOutputFactory {
    fn writer(&self) -> GuestOutput {
        GuestOutput {
            plugin: self.plugin.clone(),
            stream: self.stream,
            budget: self.budget.clone(),
            secrets: self.secrets.clone(),
            line: Vec::new(),
            tail: Vec::new(),
        }
    }
}

/// Splits written bytes into lines and logs each one.
struct GuestOutput {
    plugin: Arc<str>,
    stream: Stream,
    budget: LogBudget,
    secrets: super::GuestSecrets,
    line: Vec<u8>,
    /// The current stderr line, kept apart from the budget for the trap hint.
    tail: Vec<u8>,
}

impl GuestOutput {
    fn accept(&mut self, bytes: &[u8]) {
        if let Stream::Stderr = self.stream {
            self.remember(bytes);
        }
        self.forward(bytes);
    }

    fn remember(&mut self, bytes: &[u8]) {
        for line in bytes.split_inclusive(|b| *b == b'\n') {
            let room = STDERR_TAIL_LINE_BYTES.saturating_sub(self.tail.len());
            let content = line.strip_suffix(b"\n").unwrap_or(line);
            self.tail
                .extend_from_slice(&content[..content.len().min(room)]);
            if line.ends_with(b"\n") {
                let text = String::from_utf8_lossy(&self.tail);
                self.budget
                    .remember_stderr(self.secrets.redact(&text).as_bytes());
                self.tail.clear();
            }
        }
    }

    fn forward(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = MAX_LINE - self.line.len();
            let (chunk, newline) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) if i <= room => (&bytes[..i], true),
                _ => (&bytes[..bytes.len().min(room)], false),
            };
            let granted = self.budget.take(chunk.len());
            self.line.extend_from_slice(&chunk[..granted]);
            bytes = &bytes[chunk.len() + usize::from(newline)..];
            if newline || self.line.len() >= MAX_LINE {
                self.emit_line();
            }
        }
    }

    fn emit_line(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let line = String::from_utf8_lossy(&self.line);
        let text = self.secrets.redact(&line);
        match self.stream {
            Stream::Stdout => {
                tracing::info!(target: "sluice::guest", plugin = %self.plugin, stream = "stdout", "{text}")
            }
            Stream::Stderr => {
                tracing::warn!(target: "sluice::guest", plugin = %self.plugin, stream = "stderr", "{text}")
            }
        }
        self.line.clear();
    }
}

impl Drop for GuestOutput {
    fn drop(&mut self) {
        self.emit_line();
        if !self.tail.is_empty() {
            self.budget.remember_stderr(&self.tail);
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.accept(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.accept(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrongly_shaped_result_gets_a_hint_and_other_traps_none() {
        // Excerpts as the runtime quotes them, from real componentize-js 0.23
        // and componentize-py 0.25.1 handlers that returned a bare list.
        let js = "invalid variant specified for result / Stack: / \
                  export_messageHandler_0_1_0$handle@initializer.js:368:13 / \
                  Redirecting call to abort() to mozalloc_abort";
        assert!(trap_hint(js).is_some_and(|h| h.contains("tag: \"ok\"")));
        let py = "thread '<unnamed>' (1) panicked at runtime/src/lib.rs:1615:17: / \
                  internal error: entered unreachable code";
        assert!(trap_hint(py).is_some_and(|h| h.contains("Ok([emits])")));
        let thrown = "boom here / Stack: / handle@handler.js:8:30";
        assert_eq!(trap_hint(thrown), None);
        let rust = "thread '<unnamed>' panicked at src/lib.rs:9:5: / index out of bounds";
        assert_eq!(trap_hint(rust), None);
    }

    #[test]
    fn budget_grants_what_is_left_and_counts_the_rest() {
        let budget = LogBudget::default();
        budget.reset(10);
        assert_eq!(budget.take(4), 4);
        assert_eq!(budget.take(10), 6);
        assert_eq!(budget.take(3), 0);
        assert_eq!(budget.reset(10), 7, "dropped bytes are reported once");
        assert_eq!(budget.reset(10), 0);
    }

    #[test]
    fn long_lines_are_split_and_budget_bounds_the_buffer() {
        let budget = LogBudget::default();
        budget.reset(usize::MAX);
        let mut out = GuestOutput {
            plugin: "t".into(),
            stream: Stream::Stdout,
            budget,
            secrets: super::super::GuestSecrets::default(),
            line: Vec::new(),
            tail: Vec::new(),
        };
        out.accept(&vec![b'x'; MAX_LINE * 3 + 5]);
        assert_eq!(
            out.line.len(),
            5,
            "full lines were emitted, the tail waits for its newline"
        );
        out.accept(b"\nnext");
        assert_eq!(out.line, b"next");
    }

    #[test]
    fn a_long_stderr_keeps_its_first_lines_and_its_last() {
        let budget = LogBudget::default();
        budget.reset(0);
        let mut err = GuestOutput {
            plugin: "t".into(),
            stream: Stream::Stderr,
            budget: budget.clone(),
            secrets: super::super::GuestSecrets::default(),
            line: Vec::new(),
            tail: Vec::new(),
        };
        // A JavaScript guest's throw: the message first, then its stack,
        // then the runtime's last words.
        err.accept(b"Error: order 7 has no customer\nStack:\n");
        for frame in 0..20 {
            err.accept(format!("  at handle (frame {frame})\n").as_bytes());
        }
        err.accept(b"Redirecting call to abort() to mozalloc_abort\n");
        assert_eq!(
            budget.stderr_tail().as_deref(),
            Some(
                "Error: order 7 has no customer / Stack: / at handle (frame 0) / [17 more lines] / at handle (frame 18) / at handle (frame 19) / Redirecting call to abort() to mozalloc_abort"
            )
        );
    }

    #[test]
    fn the_stderr_tail_keeps_the_last_lines_even_past_the_budget() {
        let budget = LogBudget::default();
        budget.reset(0);
        let mut err = GuestOutput {
            plugin: "t".into(),
            stream: Stream::Stderr,
            budget: budget.clone(),
            secrets: super::super::GuestSecrets::default(),
            line: Vec::new(),
            tail: Vec::new(),
        };
        err.accept(b"one\ntwo\nthread 'main' panicked at src/lib.rs:3:5:\nbo");
        err.accept(b"om\nnote: run with `RUST_BACKTRACE=1` environment variable\n");
        assert_eq!(
            budget.stderr_tail().as_deref(),
            Some("one / two / thread 'main' panicked at src/lib.rs:3:5: / boom")
        );
        budget.reset(10);
        assert_eq!(budget.stderr_tail(), None, "each call starts clean");
    }
}
