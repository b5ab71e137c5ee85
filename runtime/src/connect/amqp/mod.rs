//! RabbitMQ (AMQP 0.9.1): a source (a consumer with manual acks,
//! `basic.ack` after the durable publish) and a sink (publisher confirms,
//! `mandatory`, persistent delivery).
//!
//! Both use lapin without its automatic recovery: a connection that fails
//! is dropped whole and a new one is made on the next call, so the source
//! knows exactly which channel each delivery tag belongs to (a tag is
//! never acknowledged on a channel other than the one it came on), and the
//! sink's outage is reported once, at once, as `unavailable`.
//!
//! [`Endpoint`] opens connections: plain TCP, or TLS with the same rustls
//! configuration as every other connector (`tls_ca`, `tls_cert`,
//! `tls_key`), and turns every error into text with the password scrubbed.

mod config;
mod sink;
mod source;

use std::sync::Arc;
use std::time::Duration;

use lapin::tcp::{AMQPUriTcpExt, RustlsConnector};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};

pub(crate) use crate::config::connectors::amqp::RoutingKey;
pub use crate::config::connectors::amqp::{AmqpConnection, AmqpSinkConfig, AmqpSourceConfig};
pub use sink::AmqpSink;
pub use source::AmqpSource;

use crate::connect::SecretUrl;
use crate::connect::tls::{self, TlsFiles};

/// How long opening a connection (TCP, TLS, AMQP handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The heartbeat asked for when the URL sets none: a broker that stops
/// answering (a half-open connection) is noticed within two of these.
const HEARTBEAT_SECS: u16 = 10;

/// Where and how to connect: the URL (shown redacted) and the TLS
/// configuration of an `amqps://` URL.
pub(crate) struct Endpoint {
    pub(crate) url: SecretUrl,
    uri: AMQPUri,
    tls: Option<Arc<rustls::ClientConfig>>,
    name: String,
}

impl Endpoint {
    /// The endpoint of the block's `url`, for the connector `name` (the
    /// connection's name in the broker's management UI). Fails on a URL
    /// lapin cannot use or TLS files that cannot be read (the message is
    /// scrubbed).
    pub(crate) fn new(
        connection: &AmqpConnection,
        files: TlsFiles<'_>,
        name: &str,
    ) -> Result<Self, String> {
        let url = &connection.url;
        let mut uri: AMQPUri = url
            .expose()
            .parse()
            .map_err(|e: String| url.scrub(&format!("`{url}` is not an AMQP URI: {e}")))?;
        if uri.query.heartbeat.is_none() {
            uri.query.heartbeat = Some(HEARTBEAT_SECS);
        }
        let tls = match uri.scheme {
            AMQPScheme::AMQPS => Some(Arc::new(files.client_config()?)),
            AMQPScheme::AMQP => None,
        };
        Ok(Endpoint {
            url: url.clone(),
            uri,
            tls,
            name: name.to_owned(),
        })
    }

    /// A new connection, or why not (scrubbed).
    pub(crate) async fn connect(&self) -> Result<Connection, String> {
        let tls = self.tls.clone();
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("sluice {}", self.name).into());
        let runtime = lapin::runtime::default_runtime().map_err(|e| self.scrub(&e))?;
        let connect = Connection::connector(
            self.uri.clone(),
            runtime,
            async move |uri: AMQPUri, runtime| {
                let host = uri.authority.host.clone();
                let mut plain = uri;
                plain.scheme = AMQPScheme::AMQP;
                let stream = plain.connect_async(&runtime).await?;
                match &tls {
                    None => Ok(stream),
                    Some(config) => {
                        let connector = RustlsConnector::from(config.clone());
                        Ok(stream.into_rustls(&connector, &host).await?)
                    }
                }
            },
            properties,
        );
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(self.scrub(&e)),
            Err(_) => Err(format!(
                "{}: no connection within {}s",
                self.url,
                CONNECT_TIMEOUT.as_secs()
            )),
        }
    }

    /// `err` as text naming the broker, with the password scrubbed and a
    /// TLS hint where it is a certificate problem.
    pub(crate) fn scrub(&self, err: &lapin::Error) -> String {
        let text = self.url.scrub(&describe_error(err));
        match tls::trust_hint(err) {
            Some(hint) => format!("{}: {text} ({hint})", self.url),
            None => format!("{}: {text}", self.url),
        }
    }
}

/// A lapin error for people: a broker's refusal with its reply code and
/// text (`404 NOT_FOUND - no queue 'in'`), else the error itself.
pub(crate) fn describe_error(err: &lapin::Error) -> String {
    match err.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            format!(
                "the broker refused: {} {}",
                amqp.get_id(),
                amqp.get_message()
            )
        }
        _ => err.to_string(),
    }
}

impl RoutingKey {
    /// Whether the template uses the message's key.
    pub(crate) fn uses_key(&self) -> bool {
        self.parts.len() > 1
    }

    /// The routing key for a message with `key`.
    pub(crate) fn render(&self, key: Option<&str>) -> Result<ShortString, String> {
        let text = if self.uses_key() {
            let Some(key) = key else {
                return Err("the routing key uses `{key}` and the message has no key".to_owned());
            };
            self.parts.join(key)
        } else {
            self.parts.concat()
        };
        ShortString::try_new(text).map_err(|e| format!("the routing key is too long: {e}"))
    }
}

/// A header value as text, if it is one: strings (UTF-8), numbers,
/// booleans and timestamps as they read; arrays and tables (RabbitMQ's own
/// `x-death`) as JSON. `Err` for bytes that are not UTF-8.
pub(crate) fn value_text(value: &AMQPValue) -> Result<String, String> {
    Ok(match value {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::DecimalValue(d) => {
            let scale = i32::from(d.scale);
            (f64::from(d.value) / 10f64.powi(scale)).to_string()
        }
        AMQPValue::Timestamp(t) => t.to_string(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::LongString(s) => utf8(s.as_bytes())?,
        AMQPValue::ByteArray(b) => utf8(b.as_slice())?,
        AMQPValue::Void => String::new(),
        AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_) => json(value).to_string(),
    })
}

fn utf8(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|e| format!("{:?} is not UTF-8", String::from_utf8_lossy(e.as_bytes())))
}

/// A value as JSON (bytes that are not UTF-8 are shown lossily).
fn json(value: &AMQPValue) -> serde_json::Value {
    match value {
        AMQPValue::FieldArray(items) => items.as_slice().iter().map(json).collect(),
        AMQPValue::FieldTable(table) => table
            .inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        AMQPValue::Boolean(b) => (*b).into(),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned().into(),
        AMQPValue::ByteArray(b) => String::from_utf8_lossy(b.as_slice()).into_owned().into(),
        AMQPValue::Void => serde_json::Value::Null,
        other => {
            let text = value_text(other).unwrap_or_default();
            text.parse::<serde_json::Number>()
                .map_or_else(|_| text.clone().into(), serde_json::Value::Number)
        }
    }
}

/// Headers as an AMQP table of long strings.
pub(crate) fn header_table<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<FieldTable, String> {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        let name = ShortString::try_new(name)
            .map_err(|e| format!("header name {name:?} is too long for AMQP: {e}"))?;
        table.insert(name, AMQPValue::LongString(LongString::from(value)));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keys_take_the_key() {
        let rk = RoutingKey::parse("orders.{key}.new").expect("parses");
        assert!(rk.uses_key());
        assert_eq!(
            rk.render(Some("eu")).expect("renders").as_str(),
            "orders.eu.new"
        );
        assert!(rk.render(None).is_err());
        let fixed = RoutingKey::parse("out").expect("parses");
        assert_eq!(fixed.render(None).expect("renders").as_str(), "out");
        assert!(RoutingKey::parse("a.{id}").is_err());
        assert!(RoutingKey::parse("a.{key").is_err());
        assert!(RoutingKey::parse("a}").is_err());
        let long = RoutingKey::parse("{key}").expect("parses");
        assert!(long.render(Some(&"k".repeat(300))).is_err());
    }

    #[test]
    fn header_values_read_as_text() {
        assert_eq!(value_text(&AMQPValue::LongInt(-3)).as_deref(), Ok("-3"));
        assert_eq!(
            value_text(&AMQPValue::LongString("héllo".into())).as_deref(),
            Ok("héllo")
        );
        assert!(value_text(&AMQPValue::LongString(vec![0xff, 0xfe].into())).is_err());
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(2));
        death.insert("queue".into(), AMQPValue::LongString("in".into()));
        let array = AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into());
        assert_eq!(
            value_text(&array).as_deref(),
            Ok(r#"[{"count":2,"queue":"in"}]"#)
        );
    }
}
