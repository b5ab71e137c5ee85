//! The far end of the soak's webhook sinks: an HTTP server on loopback that
//! counts every request into the [`Ledger`] of its path, so the outputs are
//! checked as they arrive and the store only holds what is in transit.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use super::ledger::Ledger;

/// A running receiver; stops when dropped.
pub(super) struct Receiver {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Serves `POST /<path>` into each `(path, ledger)`.
    pub fn start(routes: &[(&str, Arc<Mutex<Ledger>>)]) -> anyhow::Result<Receiver> {
        let mut app = Router::new();
        for (path, ledger) in routes {
            app = app.route(
                &format!("/{path}"),
                post(arrive).with_state(Arc::clone(ledger)),
            );
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("the receiver's runtime")?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .context("binding the receiver")?;
        let url = format!("http://{}", listener.local_addr()?);
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let served = runtime.block_on(
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .into_future(),
            );
            if let Err(err) = served {
                eprintln!("the soak's receiver stopped: {err}");
            }
        });
        Ok(Receiver {
            url,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One request from a sink: the payload is the body, the message's headers
/// come as `Sluice-Header-<name>`.
async fn arrive(
    State(ledger): State<Arc<Mutex<Ledger>>>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(format!("sluice-header-{name}"))
            .and_then(|v| v.to_str().ok())
    };
    ledger
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .record(&body, header);
    StatusCode::NO_CONTENT
}
