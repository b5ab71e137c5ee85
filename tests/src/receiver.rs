//! A real HTTP server for the tests (hyper on `127.0.0.1`, plain or TLS):
//! it records every request with its arrival time and answers as the test
//! tells it to. The webhook sink and handlers' outbound HTTP are tested
//! against it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The method, as sent.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Lowercase names, in order.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
    /// What it was answered; 0 for a request left hanging.
    pub status: u16,
}

impl Hit {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Its `Idempotency-Key`, or empty.
    pub fn key(&self) -> String {
        self.header("idempotency-key")
            .unwrap_or_default()
            .to_owned()
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// How to answer.
pub struct Reply {
    /// The status.
    pub status: u16,
    /// Headers to add.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
    /// Wait this long before answering (the request is recorded as 0).
    pub hang: Option<Duration>,
    /// Wait this long before answering (recorded with its status).
    pub delay: Option<Duration>,
}

impl Reply {
    /// An empty answer with `status`.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
            hang: None,
            delay: None,
        }
    }

    /// With this body.
    pub fn body(mut self, body: impl Into<String>) -> Reply {
        self.body = body.into();
        self
    }

    /// With this header too.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
}

/// Decides the answer from the request and how many requests with its
/// `Idempotency-Key` came before.
pub type Behaviour = Arc<dyn Fn(&Hit, usize) -> Reply + Send + Sync>;
/// The requests received, in order.
pub type Hits = Arc<Mutex<Vec<Hit>>>;

/// A real HTTP server on `127.0.0.1`, in its own runtime, stopped (every
/// connection closed) on [`stop`](Receiver::stop) or drop.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    hits: Hits,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Receiver {
    /// On any free port, plain HTTP.
    pub fn start(behaviour: Behaviour) -> Receiver {
        Receiver::start_on(0, None, behaviour, Hits::default())
    }

    /// On `port` (0: any), with TLS when given, recording into `hits`.
    pub fn start_on(
        port: u16,
        tls: Option<tokio_rustls::TlsAcceptor>,
        behaviour: Behaviour,
        hits: Hits,
    ) -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("receiver runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("bind the receiver");
        let addr = listener.local_addr().expect("addr");
        let recorded = hits.clone();
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let hits = recorded.clone();
                let behaviour = behaviour.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |req| handle(req, hits.clone(), behaviour.clone()));
                    match tls {
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Receiver {
            addr,
            hits,
            runtime: Some(runtime),
        }
    }

    /// `scheme://addr` and `path`.
    pub fn url(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://{}{path}", self.addr)
    }

    /// Every request so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Closes the listener and every connection.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn handle(
    req: Request<Incoming>,
    hits: Hits,
    behaviour: Behaviour,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let at = Instant::now();
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let mut hit = Hit {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        at,
        status: 0,
    };
    let reply = {
        let mut hits = hits.lock().unwrap_or_else(|e| e.into_inner());
        let key = hit.header("idempotency-key").unwrap_or_default();
        let earlier = hits
            .iter()
            .filter(|h| h.header("idempotency-key").unwrap_or_default() == key)
            .count();
        let reply = behaviour(&hit, earlier);
        hit.status = if reply.hang.is_some() {
            0
        } else {
            reply.status
        };
        hits.push(hit);
        reply
    };
    if let Some(wait) = reply.hang.or(reply.delay) {
        tokio::time::sleep(wait).await;
    }
    let mut response = Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        response = response.header(*name, value);
    }
    Ok(response
        .body(Full::new(Bytes::from(reply.body)))
        .expect("response"))
}

/// Answers `status` to every request.
pub fn always(status: u16) -> Behaviour {
    Arc::new(move |_, _| Reply::status(status))
}
