//! A tiny HTTP/1.0 GET over a raw TCP stream, enough for nats-server's
//! monitoring endpoints without pulling an HTTP client into the harness.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, bail};

/// How long one request may take, connect and read included; the monitoring
/// endpoints answer in microseconds, so this only bounds a wedged server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Responses larger than this are refused (`/routez` and `/varz` are a few KiB).
const MAX_RESPONSE: u64 = 16 * 1024 * 1024;

/// `GET http://127.0.0.1:<port><path>`, returning the status code and body.
///
/// HTTP/1.0 with `Connection: close`, so the server answers without chunking
/// and ends the body by closing the connection.
pub(crate) fn get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let url = format!("http://{addr}{path}");
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
        .with_context(|| format!("GET {url}: connecting"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .with_context(|| format!("GET {url}: sending the request"))?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .with_context(|| format!("GET {url}: reading the response"))?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("GET {url}: malformed response: {text:?}");
    };
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok());
    match status {
        Some(code) => Ok((code, body.to_string())),
        None => bail!("GET {url}: no status line in {head:?}"),
    }
}
