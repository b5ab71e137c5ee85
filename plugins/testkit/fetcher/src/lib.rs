//! Test plugin: a `sluice:plugin@0.2.0` handler that makes outbound HTTP
//! requests through `wasi:http/outgoing-handler`, so its stage must grant
//! `http:`.
//!
//! Built with `wit-bindgen` against `wit/v0.2/plugin.wit` for the contract
//! and the `wasip2` crate for `wasi:http`.
//!
//! Per message, by payload: `METHOD URL [BODY]` (e.g. `POST
//! http://127.0.0.1:8080/charge {"order":1}`). The handler follows one
//! redirect with a new request (which the host checks like the first) and
//! emits `status N BODY`, or `error CODE` when the request failed (the
//! host refused it, or it timed out). With config `retry_on_error`, a
//! failed request returns `retry` instead, and with `reject_status`, a
//! response of that status rejects the message.

mod bindings {
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({
        world: "handler",
        path: "../../../wit/v0.2",
    });
}

use bindings::exports::sluice::plugin::message_handler::Guest;
use bindings::sluice::plugin::host::config_get;
use bindings::sluice::plugin::types::{Emit, HandlerError, Message, Outcome};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

struct Fetcher;

fn emit(payload: impl Into<Vec<u8>>) -> Outcome {
    Ok(vec![Emit {
        topic: String::new(),
        key: None,
        headers: Vec::new(),
        payload: payload.into(),
    }])
}

/// The answer to one request: status, `Location` and body.
struct Answer {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

fn call(method: &Method, url: &str, body: &[u8]) -> Result<Answer, String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (Scheme::Https, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        return Err(format!("not an http(s) URL: {url}"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    request
        .set_method(method)
        .map_err(|()| "method refused".to_owned())?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| "scheme refused".to_owned())?;
    request
        .set_authority(Some(authority))
        .map_err(|()| "authority refused".to_owned())?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| "path refused".to_owned())?;
    let outgoing = request.body().map_err(|()| "no body".to_owned())?;
    {
        let stream = outgoing.write().map_err(|()| "no body stream".to_owned())?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("{e:?}"))?;
        }
    }
    let pending = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    OutgoingBody::finish(outgoing, None).map_err(|e| format!("{e:?}"))?;
    let response = loop {
        match pending.get() {
            Some(result) => break result,
            None => pending.subscribe().block(),
        }
    };
    let response = response
        .map_err(|()| "response taken twice".to_owned())?
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .first()
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let incoming = response.consume().map_err(|()| "no body".to_owned())?;
    let stream = incoming
        .stream()
        .map_err(|()| "no body stream".to_owned())?;
    let mut data = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => data.extend(chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(e.to_debug_string());
            }
        }
    }
    Ok(Answer {
        status,
        location,
        body: data,
    })
}

impl Guest for Fetcher {
    fn handle(msg: Message) -> Outcome {
        let text = String::from_utf8_lossy(&msg.payload).into_owned();
        let mut words = text.splitn(3, ' ');
        let method = match words.next().unwrap_or_default() {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            other => return Err(HandlerError::Reject(format!("unknown method `{other}`"))),
        };
        let url = words.next().unwrap_or_default().to_owned();
        let body = words.next().unwrap_or_default().as_bytes().to_vec();
        let mut answer = call(&method, &url, &body);
        // One redirect, as a new request the host checks again.
        if let Ok(Answer {
            status: 301 | 302 | 303 | 307 | 308,
            location: Some(to),
            ..
        }) = &answer
        {
            answer = call(&method, &to.clone(), &body);
        }
        match answer {
            Ok(answer) => {
                if config_get("reject_status").is_some_and(|s| s == answer.status.to_string()) {
                    return Err(HandlerError::Reject(format!("status {}", answer.status)));
                }
                emit(format!(
                    "status {} {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                ))
            }
            Err(_) if config_get("retry_on_error").is_some() => Err(HandlerError::Retry(None)),
            Err(error) => emit(format!("error {error}")),
        }
    }
}

bindings::export!(Fetcher with_types_in bindings);
