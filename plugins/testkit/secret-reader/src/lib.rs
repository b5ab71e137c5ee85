//! Test plugin: a `sluice:plugin@0.2.0` handler that reads a secret.
//!
//! Built directly with `wit-bindgen` against the repository's
//! `wit/v0.2/plugin.wit` (the SDKs move to 0.2.0 with the rest of its
//! capabilities), so it imports `sluice:plugin/secrets@0.2.0` and its stage
//! must grant it.
//!
//! Config keys: `secret`, the name to read (default `token`).
//!
//! Per message, by payload:
//! - `emit`: emits the secret's value (an emit is the handler's own data,
//!   published as it is);
//! - `log`: logs the value through the host, prints it to stdout and
//!   stderr, and emits `logged`;
//! - `reject`: rejects with a reason that holds the value;
//! - `trap`: prints the value to stderr and panics with it;
//! - anything else: reads the secret named by the payload and emits
//!   `read <name>`, or rejects with the host's error.

mod bindings {
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({
        world: "handler",
        path: "../../../wit/v0.2",
    });
}

use bindings::exports::sluice::plugin::message_handler::Guest;
use bindings::sluice::plugin::host::{Level, config_get, log};
use bindings::sluice::plugin::secrets::{SecretError, get};
use bindings::sluice::plugin::types::{Emit, HandlerError, Message, Outcome};

struct SecretReader;

fn emit(payload: impl Into<Vec<u8>>) -> Outcome {
    Ok(vec![Emit {
        topic: String::new(),
        key: None,
        headers: Vec::new(),
        payload: payload.into(),
    }])
}

fn read(name: &str) -> Result<String, HandlerError> {
    get(name).map_err(|SecretError::NotGranted(why)| HandlerError::Reject(why))
}

impl Guest for SecretReader {
    fn handle(msg: Message) -> Outcome {
        let name = config_get("secret").unwrap_or_else(|| "token".into());
        match msg.payload.as_slice() {
            b"emit" => emit(read(&name)?),
            b"log" => {
                let value = read(&name)?;
                log(Level::Warn, &format!("the secret is {value}"));
                println!("stdout has {value}");
                eprintln!("stderr has {value}");
                emit("logged")
            }
            b"reject" => {
                let value = read(&name)?;
                Err(HandlerError::Reject(format!("refused with {value}")))
            }
            b"trap" => {
                let value = read(&name)?;
                eprintln!("about to fail holding {value}");
                panic!("failed holding {value}");
            }
            other => {
                let asked = String::from_utf8_lossy(other).into_owned();
                read(&asked)?;
                emit(format!("read {asked}"))
            }
        }
    }
}

bindings::export!(SecretReader with_types_in bindings);
