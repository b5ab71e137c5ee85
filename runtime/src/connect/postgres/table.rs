//! The table sink: each message becomes a row, either of a table in
//! Sluice's layout (`INSERT ... ON CONFLICT (id) DO NOTHING`, so a
//! redelivery is a no-op; a batch is one multi-row insert) or through the
//! user's own statement, whose named parameters (`$id`, `$payload_json`,
//! `$header_x`, ...) are rewritten here to `$1..$n`.
//!
//! Errors map onto the sink outcomes by SQLSTATE class: 22 (data), 23
//! (constraint) and 42 (syntax, undefined object) are the row's fault:
//! `rejected` with the server's message; 08 (connection), 57 (operator
//! intervention), 42501 (a missing privilege: the setup's fault, fixed by
//! a GRANT) and a lost connection or pool timeout are an outage:
//! `unavailable`, held in place; 40 (serialisation, deadlock), 53
//! (resources) and anything else: `retry`.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::connection::ConnectSettings;
use super::{describe, quote_ident};
pub use crate::config::connectors::postgres_statement::{
    Param, RewriteError, Rewritten, rewrite_statement,
};
use crate::connect::{SecretUrl, Sink, SinkError};
use crate::plugin::Message;

impl Param {
    /// The type the parameter is prepared with.
    fn sql_type(&self) -> Type {
        match self {
            Param::Payload => Type::BYTEA,
            Param::PayloadJson => Type::JSONB,
            Param::PublishedAt => Type::TIMESTAMPTZ,
            _ => Type::TEXT,
        }
    }
}

/// What the sink writes with.
enum Mode {
    /// Rows in Sluice's layout: the multi-row insert and the DDL.
    Table {
        insert: String,
        ddl: String,
        /// The table, quoted, for `to_regclass`.
        quoted: String,
    },
    /// The user's statement.
    Statement(Rewritten),
}

/// The Postgres table sink: a pool shared by the stage's worker slots.
pub struct TableSink {
    url: SecretUrl,
    pool: Pool,
    mode: Mode,
    create: bool,
    created: tokio::sync::OnceCell<()>,
}

/// How long a write waits for a free connection, or for a new one.
const POOL_TIMEOUT: Duration = Duration::from_secs(10);

impl TableSink {
    /// A sink writing to `table` or through `statement`, not yet
    /// connected, with a pool of at most `pool_size` connections (the
    /// stage's `concurrency`: one per worker slot, opened on demand).
    /// `table` must have passed `check_sql_identifier`.
    pub(crate) fn new(
        url: SecretUrl,
        settings: ConnectSettings,
        table: Option<&str>,
        statement: Option<&str>,
        create: bool,
        pool_size: usize,
    ) -> Result<TableSink, String> {
        let ConnectSettings { mut config, tls } = settings;
        config.connect_timeout(POOL_TIMEOUT);
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(POOL_TIMEOUT))
            .recycle_timeout(Some(POOL_TIMEOUT))
            .build()
            .map_err(|e| e.to_string())?;
        let mode = match (table, statement) {
            (Some(table), _) => {
                let quoted = quote_ident(table);
                Mode::Table {
                    insert: format!(
                        "INSERT INTO {quoted} (id, topic, key, headers, payload, published_at) \
                         SELECT i, t, k, h::jsonb, p, to_timestamp(ms / 1000.0) \
                         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bigint[]) \
                         AS r(i, t, k, h, p, ms) \
                         ON CONFLICT (id) DO NOTHING"
                    ),
                    ddl: table_ddl(table),
                    quoted,
                }
            }
            (None, Some(statement)) => {
                Mode::Statement(rewrite_statement(statement).map_err(|e| e.to_string())?)
            }
            (None, None) => return Err("neither `table` nor `statement` is given".into()),
        };
        Ok(TableSink {
            url,
            pool,
            mode,
            create,
            created: tokio::sync::OnceCell::new(),
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, SinkError> {
        let client = self.pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => SinkError::Unavailable(self.said(&e)),
            other => SinkError::Unavailable(
                self.url
                    .scrub(&format!("postgres at {}: no connection: {other}", self.url)),
            ),
        })?;
        if let Mode::Table {
            ddl, quoted: table, ..
        } = &self.mode
            && self.create
        {
            self.created
                .get_or_try_init(|| async {
                    // A table that cannot be created (no privilege, no
                    // schema) is the target being unusable, not the
                    // message's fault: it waits, and readiness says why.
                    // Only a missing table is created: a user without
                    // CREATE on the schema can write to a table made for it.
                    let present = client
                        .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
                        .await
                        .and_then(|row| row.try_get::<_, bool>(0))
                        .map_err(|e| SinkError::Unavailable(self.said(&e)))?;
                    if present {
                        return Ok(());
                    }
                    client
                        .batch_execute(ddl)
                        .await
                        .map_err(|e| SinkError::Unavailable(self.said(&e)))
                })
                .await?;
        }
        Ok(client)
    }

    fn said(&self, err: &tokio_postgres::Error) -> String {
        format!("postgres at {}: {}", self.url, describe(&self.url, err))
    }

    /// The outcome of a failed statement, by SQLSTATE class.
    fn classify(&self, err: &tokio_postgres::Error) -> SinkError {
        let text = self.said(err);
        let code = err.code().map(|c| c.code());
        // Class 42 (a missing table, column or privilege, a syntax error
        // in `statement:`, a type the statement cannot take) is the
        // target's setup, not the message: every message would fail the
        // same way, so it waits for the migration or GRANT (readiness
        // says why) instead of dead-lettering everything.
        if code.is_some_and(|c| c.starts_with("42")) {
            return SinkError::Unavailable(text);
        }
        // `statement_timeout` cancelled it: a slow statement, which may
        // be this message's doing, so it spends an attempt (as the
        // stage's own `timeout` does) rather than holding forever.
        if code == Some("57014") {
            return SinkError::Retry {
                reason: text,
                after: None,
            };
        }
        match code.map(|c| c.get(..2).unwrap_or_default()) {
            // Bad data (22), a broken constraint (23), a subquery of the
            // user's statement with more rows than one (21), a view's
            // check option (44), an exception a trigger raised (P0): this
            // row, every time.
            Some("21" | "22" | "23" | "44" | "P0") => SinkError::Rejected(text),
            Some("08" | "57") | None => SinkError::Unavailable(text),
            Some(_) => SinkError::Retry {
                reason: text,
                after: None,
            },
        }
    }

    async fn insert_rows(&self, insert: &str, messages: &[&Message]) -> Result<(), SinkError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(insert)
            .await
            .map_err(|e| self.classify(&e))?;
        let ids: Vec<&str> = messages.iter().map(|m| m.id.as_str()).collect();
        let topics: Vec<&str> = messages.iter().map(|m| m.topic.as_str()).collect();
        let keys: Vec<Option<&str>> = messages.iter().map(|m| m.key.as_deref()).collect();
        let headers: Vec<String> = messages
            .iter()
            .map(|m| headers_json(m).to_string())
            .collect();
        let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
        let published: Vec<i64> = messages
            .iter()
            .map(|m| i64::try_from(m.published_at).unwrap_or(i64::MAX))
            .collect();
        client
            .execute(
                &statement,
                &[&ids, &topics, &keys, &headers, &payloads, &published],
            )
            .await
            .map_err(|e| self.classify(&e))?;
        Ok(())
    }

    async fn run_statement(
        &self,
        rewritten: &Rewritten,
        messages: &[&Message],
    ) -> Result<(), SinkError> {
        // Values first: a message whose body the statement cannot take is
        // refused before anything is sent.
        let mut values = Vec::with_capacity(messages.len());
        for message in messages {
            values.push(Values::of(message, &rewritten.params)?);
        }
        let mut client = self.client().await?;
        let types: Vec<Type> = rewritten.params.iter().map(Param::sql_type).collect();
        let statement = client
            .prepare_typed_cached(&rewritten.sql, &types)
            .await
            .map_err(|e| self.classify(&e))?;
        if let [one] = values.as_slice() {
            client
                .execute(&statement, &one.refs())
                .await
                .map_err(|e| self.classify(&e))?;
            return Ok(());
        }
        let tx = client.transaction().await.map_err(|e| self.classify(&e))?;
        // Pipelined on the one connection, in one transaction.
        let runs = values.iter().map(|v| {
            let params = v.refs();
            let tx = &tx;
            let statement = &statement;
            async move { tx.execute(statement, &params).await }
        });
        for result in futures_util::future::join_all(runs).await {
            result.map_err(|e| self.classify(&e))?;
        }
        tx.commit().await.map_err(|e| self.classify(&e))
    }

    async fn write_all(&self, messages: &[&Message]) -> Result<(), SinkError> {
        match &self.mode {
            Mode::Table { insert, .. } => self.insert_rows(insert, messages).await,
            Mode::Statement(rewritten) => self.run_statement(rewritten, messages).await,
        }
    }
}

/// The DDL `create: true` runs for `table`.
pub(crate) fn table_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n\
         \x20   id text PRIMARY KEY,\n\
         \x20   topic text,\n\
         \x20   key text,\n\
         \x20   headers jsonb,\n\
         \x20   payload bytea,\n\
         \x20   published_at timestamptz\n\
         )",
        quote_ident(table)
    )
}

/// A message's headers as a JSON object; a name that repeats gets an
/// array of its values.
pub(crate) fn headers_json(message: &Message) -> serde_json::Value {
    let mut map: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, value) in &message.headers {
        map.entry(name).or_default().push(value);
    }
    serde_json::Value::Object(
        map.into_iter()
            .map(|(name, values)| {
                let value = match values.as_slice() {
                    [one] => serde_json::Value::from(*one),
                    many => serde_json::Value::from(many.to_vec()),
                };
                (name.to_owned(), value)
            })
            .collect(),
    )
}

/// A payload sent as `jsonb` as it is: the server parses it, so a body
/// that is not JSON is refused with the server's own message (SQLSTATE
/// 22P02, `rejected`).
#[derive(Debug)]
struct RawJson(Vec<u8>);

impl ToSql for RawJson {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            // The jsonb binary format: a version byte, then the text.
            out.extend_from_slice(&[1]);
        }
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    to_sql_checked!();
}

/// One value per statement parameter, for one message.
struct Values(Vec<Box<dyn ToSql + Sync + Send>>);

impl Values {
    fn of(message: &Message, params: &[Param]) -> Result<Values, SinkError> {
        let mut values: Vec<Box<dyn ToSql + Sync + Send>> = Vec::with_capacity(params.len());
        for param in params {
            values.push(match param {
                Param::Id => Box::new(message.id.clone()),
                Param::Topic => Box::new(message.topic.clone()),
                Param::Key => Box::new(message.key.clone()),
                Param::Payload => Box::new(message.payload.clone()),
                Param::PayloadText => {
                    Box::new(String::from_utf8(message.payload.clone()).map_err(|e| {
                        SinkError::Rejected(format!(
                            "the payload is not UTF-8 text, which `$payload_text` needs: {e}"
                        ))
                    })?)
                }
                Param::PayloadJson => Box::new(RawJson(message.payload.clone())),
                Param::PublishedAt => {
                    Box::new(UNIX_EPOCH + Duration::from_millis(message.published_at))
                        as Box<dyn ToSql + Sync + Send>
                }
                Param::Header(name) => {
                    let value = header(message, name)
                        .or_else(|| header(message, &name.replace('_', "-")))
                        .map(str::to_owned);
                    Box::new(value)
                }
            });
        }
        Ok(Values(values))
    }

    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.0
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[async_trait]
impl Sink for TableSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        self.write_all(&[message]).await
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let all: Vec<&Message> = messages.iter().collect();
        match self.write_all(&all).await {
            Ok(()) => messages.iter().map(|_| Ok(())).collect(),
            // One row the target refuses fails the whole statement (as a
            // rejection, or as anything else a trigger or the user's
            // statement may raise): write them one by one, so only the
            // bad ones fail. An unreachable target holds the whole batch.
            Err(SinkError::Rejected(_) | SinkError::Retry { .. }) if messages.len() > 1 => {
                let mut results = Vec::with_capacity(messages.len());
                for message in messages {
                    results.push(self.write(message).await);
                }
                results
            }
            Err(err) => messages.iter().map(|_| Err(err.clone())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(sql: &str) -> Rewritten {
        rewrite_statement(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    #[test]
    fn named_parameters_become_positional() {
        let r = rw("INSERT INTO t (a, b, c) VALUES ($id, $payload_json, $id) -- $nope\n");
        assert_eq!(
            r.sql,
            "INSERT INTO t (a, b, c) VALUES ($1, $2, $1) -- $nope\n"
        );
        assert_eq!(r.params, vec![Param::Id, Param::PayloadJson]);
        let r = rw("SELECT $header_x_y,$key::text||$topic");
        assert_eq!(r.sql, "SELECT $1,$2::text||$3");
        assert_eq!(
            r.params,
            vec![Param::Header("x_y".into()), Param::Key, Param::Topic]
        );
    }

    #[test]
    fn literals_comments_and_dollar_quotes_are_left_alone() {
        for sql in [
            "SELECT '$id', 'it''s $key', E'\\' $x'",
            "SELECT \"$id\", \"a\"\"$b\"",
            "SELECT 1 /* $id /* nested $key */ still $topic */",
            "SELECT $$ $id $$, $fn$ body $payload $fn$",
            "SELECT a$b FROM t -- $id",
        ] {
            let r = rw(sql);
            assert_eq!(r.sql, sql, "{sql}");
            assert!(r.params.is_empty(), "{sql}: {:?}", r.params);
        }
        let r = rw("SELECT 'x', $payload_text, $tag$ $id $tag$, $published_at");
        assert_eq!(r.sql, "SELECT 'x', $1, $tag$ $id $tag$, $2");
        assert_eq!(r.params, vec![Param::PayloadText, Param::PublishedAt]);
    }

    #[test]
    fn bad_statements_are_refused() {
        assert_eq!(
            rewrite_statement("SELECT $nope"),
            Err(RewriteError::Unknown("nope".into()))
        );
        assert_eq!(
            rewrite_statement("SELECT $header_"),
            Err(RewriteError::Unknown("header_".into()))
        );
        assert_eq!(
            rewrite_statement("SELECT $1"),
            Err(RewriteError::Positional("1".into()))
        );
        for sql in ["SELECT 'x", "SELECT \"x", "SELECT /* x", "SELECT $a$ x"] {
            assert!(
                matches!(rewrite_statement(sql), Err(RewriteError::Unterminated(_))),
                "{sql}"
            );
        }
    }

    #[tokio::test]
    async fn the_pool_is_as_big_as_the_concurrency() {
        let url = SecretUrl::parse("postgres://u:pw@127.0.0.1:1/db").expect("url");
        for size in [1, 4] {
            let settings = super::super::connection::settings(
                &url,
                Default::default(),
                Duration::from_secs(30),
            )
            .expect("settings");
            let sink =
                TableSink::new(url.clone(), settings, Some("t"), None, true, size).expect("sink");
            assert_eq!(sink.pool.status().max_size, size);
        }
    }

    #[test]
    fn headers_become_an_object() {
        let mut m = Message::new("a", "t", b"x".to_vec());
        m.headers = vec![
            ("a".into(), "1".into()),
            ("b".into(), "2".into()),
            ("a".into(), "3".into()),
        ];
        assert_eq!(
            headers_json(&m),
            serde_json::json!({"a": ["1", "3"], "b": "2"})
        );
        assert!(Values::of(&m, &[Param::PayloadJson, Param::Header("a".into())]).is_ok());
        m.payload = vec![0xff];
        assert!(matches!(
            Values::of(&m, &[Param::PayloadText]),
            Err(SinkError::Rejected(_))
        ));
    }
}
