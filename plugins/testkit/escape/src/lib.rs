//! Test plugin: tries to break out of the sandbox and reports what it got.
//!
//! For every message it tries each ambient capability below and emits one JSON
//! object to the default output, with one entry per attempt of the form
//! `{"ok": bool, "detail": string}`. `ok: true` means the capability WAS
//! obtained (a sandbox leak); `detail` says what was seen or which error was
//! returned. It never panics: every failure is reported as `ok: false`.
//!
//! | entry         | attempt                                                        |
//! |---------------|----------------------------------------------------------------|
//! | `read_file`   | `std::fs::read("/etc/passwd")`                                 |
//! | `list_dir`    | `std::fs::read_dir("/")`                                       |
//! | `env_var`     | `std::env::var("HOME")`                                        |
//! | `env_count`   | ok if the environment holds at least one variable              |
//! | `args`        | ok if there is at least one command-line argument              |
//! | `tcp_connect` | a TCP connect to 127.0.0.1:4222 through `wasi:sockets/tcp`     |
//! | `dns`         | `wasi:sockets/ip-name-lookup` resolve of `localhost`           |
//!
//! The sockets are driven through the raw WASI interfaces because `std::net`
//! is not fully supported on `wasm32-wasip2`. Each socket attempt waits at
//! most 2 seconds.
//!
//! Config keys: none.

use std::net::Ipv6Addr;

use serde_json::{Map, Value, json};
use sluice_sdk::{Emit, Message, Outcome};
use wasip2::clocks::monotonic_clock;
use wasip2::io::poll::{Pollable, poll};
use wasip2::sockets::network::{ErrorCode, IpAddress, IpAddressFamily, IpSocketAddress};
use wasip2::sockets::{instance_network, ip_name_lookup, tcp_create_socket};

/// How long a socket attempt may wait, in nanoseconds.
const SOCKET_WAIT_NS: u64 = 2_000_000_000;

/// One attempt: `Ok(what was obtained)` or `Err(why not)`.
type Probe = fn() -> Result<String, String>;

fn handle(_msg: Message) -> Outcome {
    let probes: [(&str, Probe); 7] = [
        ("read_file", read_file),
        ("list_dir", list_dir),
        ("env_var", env_var),
        ("env_count", env_count),
        ("args", args),
        ("tcp_connect", tcp_connect),
        ("dns", dns),
    ];
    let mut report = Map::new();
    for (name, probe) in probes {
        let (ok, detail) = match probe() {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        report.insert(name.to_owned(), json!({ "ok": ok, "detail": detail }));
    }
    Ok(vec![Emit::json("", &Value::Object(report))?])
}

fn read_file() -> Result<String, String> {
    let bytes = std::fs::read("/etc/passwd").map_err(|e| e.to_string())?;
    Ok(format!("read {} bytes from /etc/passwd", bytes.len()))
}

fn list_dir() -> Result<String, String> {
    let entries = std::fs::read_dir("/").map_err(|e| e.to_string())?;
    Ok(format!("listed / with {} entries", entries.count()))
}

fn env_var() -> Result<String, String> {
    let home = std::env::var("HOME").map_err(|e| e.to_string())?;
    Ok(format!("HOME={home}"))
}

fn env_count() -> Result<String, String> {
    // `vars_os` rather than `vars`: it cannot panic on a non-UTF-8 value.
    match std::env::vars_os().count() {
        0 => Err("the environment is empty".to_owned()),
        n => Ok(format!("{n} environment variables")),
    }
}

fn args() -> Result<String, String> {
    match std::env::args_os().count() {
        0 => Err("there are no arguments".to_owned()),
        n => Ok(format!("{n} arguments")),
    }
}

fn tcp_connect() -> Result<String, String> {
    let network = instance_network::instance_network();
    let socket = tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4)
        .map_err(|e| format!("create-tcp-socket: {e}"))?;
    let remote = IpSocketAddress::Ipv4(wasip2::sockets::network::Ipv4SocketAddress {
        port: 4222,
        address: (127, 0, 0, 1),
    });
    socket
        .start_connect(&network, remote)
        .map_err(|e| format!("start-connect: {e}"))?;
    // Pollables are children of the socket: declared after it, dropped before.
    let ready = socket.subscribe();
    let deadline = monotonic_clock::subscribe_duration(SOCKET_WAIT_NS);
    loop {
        match socket.finish_connect() {
            Ok(_streams) => return Ok("connected to 127.0.0.1:4222".to_owned()),
            Err(ErrorCode::WouldBlock) => wait(&ready, &deadline, "finish-connect")?,
            Err(e) => return Err(format!("finish-connect: {e}")),
        }
    }
}

fn dns() -> Result<String, String> {
    let network = instance_network::instance_network();
    let stream = ip_name_lookup::resolve_addresses(&network, "localhost")
        .map_err(|e| format!("resolve-addresses: {e}"))?;
    let ready = stream.subscribe();
    let deadline = monotonic_clock::subscribe_duration(SOCKET_WAIT_NS);
    let mut found = Vec::new();
    loop {
        match stream.resolve_next_address() {
            Ok(Some(address)) => found.push(show(address)),
            Ok(None) => break,
            Err(ErrorCode::WouldBlock) => wait(&ready, &deadline, "resolve-next-address")?,
            Err(e) => return Err(format!("resolve-next-address: {e}")),
        }
    }
    match found.is_empty() {
        true => Err("resolved localhost to no address".to_owned()),
        false => Ok(format!("localhost is {}", found.join(", "))),
    }
}

/// Waits until `ready` fires, or fails once `deadline` has passed.
fn wait(ready: &Pollable, deadline: &Pollable, what: &str) -> Result<(), String> {
    if poll(&[ready, deadline]).contains(&0) {
        Ok(())
    } else {
        Err(format!("{what}: no answer within 2 s"))
    }
}

fn show(address: IpAddress) -> String {
    match address {
        IpAddress::Ipv4((a, b, c, d)) => format!("{a}.{b}.{c}.{d}"),
        IpAddress::Ipv6((a, b, c, d, e, f, g, h)) => {
            Ipv6Addr::new(a, b, c, d, e, f, g, h).to_string()
        }
    }
}

sluice_sdk::export_handler!(handle);
