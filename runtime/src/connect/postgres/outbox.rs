//! The outbox source: producers insert rows into an outbox table in the
//! same transaction as their business rows; this source takes them in
//! `id` order with `FOR UPDATE SKIP LOCKED` (so several daemons share the
//! table, each row taken by one), keeps the transaction open while the
//! runner publishes them, then deletes them and commits. A crash or a
//! lost connection before the commit rolls back on the server: the rows
//! stay and are read again, and the runner's message ids
//! (`<source>:<row id>`) collapse the duplicates.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client};

use super::connection::ConnectSettings;
use super::{describe, quote_ident};
use crate::connect::names::sql_object_name;
use crate::connect::{Capabilities, SecretUrl, Source, SourceError, SourceMessage};

/// How long connecting may take before it counts as an outage.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read (beyond its wait) or an ack may take: a server that
/// stops answering is an outage, and the connection is dropped (its open
/// transaction is rolled back by the server).
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many published-but-undeleted row ids a source remembers
/// (`OutboxSource::published`): 8 bytes each, and far more than the reads
/// a daemon has in flight when a server goes away.
const MAX_REMEMBERED: usize = 100_000;
/// The server ends a read's transaction left idle this long (a daemon
/// stuck publishing, a half-open connection nobody notices): its locks
/// would otherwise hold back vacuum and queue every DDL on the table
/// behind them. The rows are read again; ones already published are
/// deleted then, not sent twice (`OutboxSource::published`).
const IDLE_IN_READ: &str = "5min";

/// The notification channel of an outbox table: `sluice_outbox_<table>`
/// (a `.` becomes `_`), cut to a Postgres identifier's 63 bytes with a
/// hash ([`sql_object_name`]).
pub(crate) fn channel(table: &str) -> String {
    sql_object_name(&format!("sluice_outbox_{}", table.replace('.', "_")))
}

/// The trigger on an outbox table, `<table>_sluice_notify` (its table's
/// own name, without the schema: a trigger lives in its table).
fn trigger_name(table: &str) -> String {
    sql_object_name(&format!(
        "{}_sluice_notify",
        table.rsplit('.').next().unwrap_or(table)
    ))
}

/// The notify function of an outbox table, `<table>_sluice_notify` in the
/// table's schema, quoted.
fn function_name(table: &str) -> String {
    match table.rsplit_once('.') {
        Some((schema, name)) => format!(
            "{}.{}",
            quote_ident(schema),
            quote_ident(&sql_object_name(&format!("{name}_sluice_notify")))
        ),
        None => quote_ident(&sql_object_name(&format!("{table}_sluice_notify"))),
    }
}

/// The DDL `create: true` runs (in one transaction, under an advisory
/// lock so daemons starting together do not race, with a `lock_timeout`
/// so producers never queue behind it for long): the table if it is
/// missing, the notify function, and a statement trigger that notifies
/// [`channel`] on insert, created only if missing (creating a trigger
/// locks the table against inserts).
pub(crate) fn create_ddl(table: &str) -> String {
    let quoted = quote_ident(table);
    let channel = channel(table);
    let function = function_name(table);
    let trigger = trigger_name(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {quoted} (\n\
         \x20   id bigserial PRIMARY KEY,\n\
         \x20   payload bytea NOT NULL,\n\
         \x20   key text,\n\
         \x20   headers jsonb,\n\
         \x20   created_at timestamptz NOT NULL DEFAULT now()\n\
         );\n\
         CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sluice$\n\
         BEGIN\n\
         \x20   PERFORM pg_notify('{channel}', '');\n\
         \x20   RETURN NULL;\n\
         END\n\
         $sluice$;\n\
         DO $sluice$\n\
         BEGIN\n\
         \x20   IF NOT EXISTS (SELECT 1 FROM pg_trigger\n\
         \x20                  WHERE tgname = '{trigger}' AND tgrelid = '{quoted}'::regclass) THEN\n\
         \x20       CREATE TRIGGER \"{trigger}\" AFTER INSERT ON {quoted}\n\
         \x20           FOR EACH STATEMENT EXECUTE FUNCTION {function}();\n\
         \x20   END IF;\n\
         END\n\
         $sluice$;"
    )
}

/// One connection of the source: it reads, and it `LISTEN`s.
struct Conn {
    client: Client,
    /// Woken by each notification on the channel (a permit is kept when
    /// nobody waits, so a notification between a read and the wait is
    /// not missed).
    notified: Arc<Notify>,
}

/// The outbox source of one daemon: one dedicated connection.
pub struct OutboxSource {
    url: SecretUrl,
    /// The parsed URL, TLS and session settings.
    settings: ConnectSettings,
    table: String,
    create: bool,
    poll: Duration,
    conn: Option<Conn>,
    /// The ids of the last read, its transaction still open.
    pending: Vec<i64>,
    /// The ids of the last read whatever became of its transaction: if
    /// its ack fails they were published all the same.
    read_ids: Vec<i64>,
    /// Rows this source published whose delete did not commit (the
    /// connection or the server went between the two). They come back
    /// when their locks go, which may be long after the topic's duplicate
    /// window (a server down for minutes): they are deleted then, not
    /// published again. At most [`MAX_REMEMBERED`], oldest dropped first.
    published: std::collections::BTreeSet<i64>,
    /// Rows of the open transaction deleted because they were in
    /// `published`: forgotten once it commits.
    redeleted: Vec<i64>,
    /// A transaction is open on `conn`.
    in_tx: bool,
    /// The last read's transaction was lost with its connection: its
    /// `ack` must fail (the rows are read again), not report success.
    lost: bool,
    /// The table and trigger were found or created on this connection.
    create_done: bool,
    /// When the table was last read, on this connection (`None`: not yet,
    /// so rows inserted while it was away are read at once).
    last_query: Option<std::time::Instant>,
    /// The last read was full: more rows are likely waiting.
    more: bool,
    select: String,
    delete: String,
    lag: String,
}

impl OutboxSource {
    /// A source for `table` (checked by `check_sql_identifier`), not yet
    /// connected.
    pub(crate) fn new(
        url: SecretUrl,
        settings: ConnectSettings,
        table: String,
        create: bool,
        poll: Duration,
    ) -> Self {
        let quoted = quote_ident(&table);
        OutboxSource {
            select: format!(
                "SELECT id, payload, key, headers FROM {quoted} ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
            ),
            delete: format!("DELETE FROM {quoted} WHERE id = ANY($1)"),
            lag: format!("SELECT coalesce(max(id) - min(id) + 1, 0)::bigint FROM {quoted}"),
            url,
            settings,
            table,
            create,
            poll,
            conn: None,
            pending: Vec::new(),
            read_ids: Vec::new(),
            published: std::collections::BTreeSet::new(),
            redeleted: Vec::new(),
            in_tx: false,
            lost: false,
            create_done: false,
            last_query: None,
            more: false,
        }
    }

    fn unavailable(&mut self, err: &tokio_postgres::Error) -> SourceError {
        // Whatever broke, start again on a fresh connection: an open
        // transaction is rolled back by the server when this one closes.
        self.conn = None;
        self.lost |= self.in_tx;
        self.in_tx = false;
        self.pending.clear();
        SourceError::Unavailable(format!(
            "postgres outbox `{}` at {}: {}",
            self.table,
            self.url,
            describe(&self.url, err)
        ))
    }

    async fn connect(&mut self) -> Result<(), SourceError> {
        if self.conn.as_ref().is_some_and(|c| !c.client.is_closed()) {
            return Ok(());
        }
        self.conn = None;
        self.in_tx = false;
        self.pending.clear();
        let connecting = tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.settings.config.connect(self.settings.tls.clone()),
        )
        .await;
        let (client, mut connection) = match connecting {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(self.unavailable(&e)),
            Err(_) => {
                return Err(SourceError::Unavailable(format!(
                    "postgres outbox `{}` at {}: connecting took longer than {}s",
                    self.table,
                    self.url,
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
        };
        let notified = Arc::new(Notify::new());
        let wake = notified.clone();
        // Drives the connection and forwards its notifications; ends when
        // the connection does (the client then reports itself closed).
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            wake.notify_one();
        });
        if let Err(e) = client
            .batch_execute(&format!(
                "SET idle_in_transaction_session_timeout = '{IDLE_IN_READ}'"
            ))
            .await
        {
            return Err(self.unavailable(&e));
        }
        if self.create {
            // Only what is missing is created: a user without CREATE on
            // the schema can drain an outbox made for it.
            let trigger = trigger_name(&self.table);
            let present = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = $1 AND tgrelid = to_regclass($2))",
                    &[&trigger, &quote_ident(&self.table)],
                )
                .await
                .and_then(|row| row.try_get::<_, bool>(0));
            let present = match present {
                Ok(present) => present,
                Err(e) => return Err(self.unavailable(&e)),
            };
            if present {
                self.create_done = true;
            }
        }
        if self.create && !self.create_done {
            let ddl = format!(
                "BEGIN; SET LOCAL lock_timeout = '5s'; \
                 SELECT pg_advisory_xact_lock(hashtext('sluice outbox ddl')); {} COMMIT;",
                create_ddl(&self.table)
            );
            if let Err(e) = client.batch_execute(&ddl).await {
                // A table someone else owns, made without the trigger: the
                // source cannot add it, but can still read, every `poll`.
                let denied =
                    e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE);
                let _ = client.batch_execute("ROLLBACK").await;
                let exists = denied
                    && client
                        .query_one(
                            "SELECT to_regclass($1) IS NOT NULL",
                            &[&quote_ident(&self.table)],
                        )
                        .await
                        .and_then(|row| row.try_get::<_, bool>(0))
                        .unwrap_or(false);
                if !exists {
                    return Err(self.unavailable(&e));
                }
                tracing::warn!(
                    table = %self.table,
                    error = %describe(&self.url, &e),
                    "cannot create the outbox's notify trigger (its owner can, with the DDL in docs/connectors/postgres.md, or set `create: false`); reading every `poll` instead"
                );
            }
            self.create_done = true;
        }
        if let Err(e) = client
            .batch_execute(&format!("LISTEN \"{}\"", channel(&self.table)))
            .await
        {
            return Err(self.unavailable(&e));
        }
        self.conn = Some(Conn { client, notified });
        // Notifications sent while it was away were lost: read at once.
        self.last_query = None;
        Ok(())
    }

    /// One attempt: `BEGIN`, select; the transaction stays open when rows
    /// came back, and is rolled back otherwise.
    async fn take(&mut self, max: usize) -> Result<Vec<SourceMessage>, SourceError> {
        let Some(conn) = &self.conn else {
            return Ok(Vec::new());
        };
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = match conn.client.batch_execute("BEGIN").await {
            Ok(()) => {
                self.in_tx = true;
                conn.client.query(&self.select, &[&limit]).await
            }
            Err(e) => Err(e),
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return Err(self.unavailable(&e)),
        };
        if rows.is_empty() {
            self.rollback().await;
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(rows.len());
        let mut known = Vec::new();
        for row in &rows {
            let mapped = map_row(
                row.try_get(0),
                row.try_get(1),
                row.try_get(2),
                row.try_get(3),
            );
            match mapped {
                Ok((id, _)) if self.published.contains(&id) => known.push(id),
                Ok((id, message)) => {
                    self.pending.push(id);
                    out.push(message);
                }
                Err(e) => return Err(self.unavailable(&e)),
            }
        }
        if !known.is_empty() {
            self.forget_published(known, out.is_empty()).await?;
        }
        self.read_ids.clone_from(&self.pending);
        Ok(out)
    }

    /// Deletes rows this source already published (see `published`) in
    /// the open transaction, committing at once when the read holds
    /// nothing else (else with the read's own delete, at its ack).
    async fn forget_published(&mut self, ids: Vec<i64>, commit: bool) -> Result<(), SourceError> {
        tracing::info!(
            table = %self.table,
            rows = ids.len(),
            "postgres outbox: rows published before their delete failed are deleted now, not published again"
        );
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        let mut done = conn.client.execute(&self.delete, &[&ids]).await.map(|_| ());
        if done.is_ok() && commit {
            done = conn.client.batch_execute("COMMIT").await;
            self.in_tx = false;
        }
        match done {
            Ok(()) if commit => {
                for id in &ids {
                    self.published.remove(id);
                }
                Ok(())
            }
            Ok(()) => {
                self.redeleted = ids;
                Ok(())
            }
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    /// Notes that the last read was published but its delete may not have
    /// committed.
    fn remember_published(&mut self) {
        self.published.extend(self.read_ids.drain(..));
        while self.published.len() > MAX_REMEMBERED {
            self.published.pop_first();
        }
    }

    async fn rollback(&mut self) {
        self.pending.clear();
        if !self.in_tx {
            return;
        }
        self.in_tx = false;
        let failed = match &self.conn {
            Some(conn) => conn.client.batch_execute("ROLLBACK").await.err(),
            None => None,
        };
        if let Some(e) = failed {
            // The server rolls back when the connection goes.
            let _ = self.unavailable(&e);
        }
    }
}

/// One outbox row as a source message: `(id, message)`. The headers
/// column must hold a JSON object (or NULL): string values are taken as
/// they are, others as their JSON text; anything else is a `problem`,
/// so the row is dead-lettered rather than lost or stuck.
pub(crate) fn map_row(
    id: Result<i64, tokio_postgres::Error>,
    payload: Result<Vec<u8>, tokio_postgres::Error>,
    key: Result<Option<String>, tokio_postgres::Error>,
    headers: Result<Option<serde_json::Value>, tokio_postgres::Error>,
) -> Result<(i64, SourceMessage), tokio_postgres::Error> {
    let id = id?;
    let mut message = SourceMessage::new(id.to_string(), Bytes::from(payload?));
    message.key = key?;
    match headers? {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(map)) => {
            message.headers = map
                .into_iter()
                .map(|(name, value)| match value {
                    serde_json::Value::String(text) => (name, text),
                    other => (name, other.to_string()),
                })
                .collect();
        }
        Some(other) => {
            let mut shown = other.to_string();
            if shown.len() > 100 {
                let mut end = 100;
                while !shown.is_char_boundary(end) {
                    end -= 1;
                }
                shown.truncate(end);
                shown.push('…');
            }
            message.problem = Some(format!(
                "outbox row {id}: `headers` must be a JSON object of names to values, not {shown}"
            ));
        }
    }
    Ok((id, message))
}

#[async_trait]
impl Source for OutboxSource {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            lag: true,
            // One transaction per read; rows leave in id order.
            ordered_by_key: true,
            ..Capabilities::default()
        }
    }

    async fn read(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let limit = QUERY_TIMEOUT + CONNECT_TIMEOUT * 2 + wait;
        match tokio::time::timeout(limit, self.read_now(max, wait)).await {
            Ok(read) => read,
            Err(_) => Err(self.hung("a read")),
        }
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        let done = match tokio::time::timeout(QUERY_TIMEOUT, self.ack_now()).await {
            Ok(done) => done,
            Err(_) => Err(self.hung("the commit")),
        };
        match &done {
            Ok(()) => {
                self.read_ids.clear();
                for id in std::mem::take(&mut self.redeleted) {
                    self.published.remove(&id);
                }
            }
            Err(_) => {
                self.remember_published();
                self.redeleted.clear();
            }
        }
        done
    }

    async fn release(&mut self) {
        // Not published: read again, and published then.
        self.read_ids.clear();
        self.redeleted.clear();
        if tokio::time::timeout(QUERY_TIMEOUT, self.rollback())
            .await
            .is_err()
        {
            let _ = self.hung("the rollback");
        }
        self.lost = false;
    }

    async fn lag(&mut self) -> Option<u64> {
        match tokio::time::timeout(QUERY_TIMEOUT, self.lag_now()).await {
            Ok(lag) => lag,
            Err(_) => {
                let _ = self.hung("the lag estimate");
                None
            }
        }
    }
}

impl OutboxSource {
    /// The server did not answer `what` in time: drop the connection.
    fn hung(&mut self, what: &str) -> SourceError {
        self.conn = None;
        self.lost |= self.in_tx;
        self.in_tx = false;
        self.pending.clear();
        SourceError::Unavailable(format!(
            "postgres outbox `{}` at {}: no answer to {what} in time; reconnecting",
            self.table, self.url
        ))
    }

    async fn read_now(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        // A read neither acked nor released (should not happen): give it
        // back first.
        self.read_ids.clear();
        self.redeleted.clear();
        self.rollback().await;
        self.lost = false;
        self.connect().await?;
        // The table is read when a notification came, when `poll` has
        // passed since the last read, when that one was full, or on a new
        // connection; not on every call (the runner asks every second).
        let due = |source: &Self| {
            source.more
                || source
                    .last_query
                    .is_none_or(|at| at.elapsed() >= source.poll)
        };
        if due(self) {
            let read = self.take_noting(max).await?;
            if !read.is_empty() {
                return Ok(read);
            }
        }
        let Some(conn) = &self.conn else {
            return Ok(Vec::new());
        };
        let notified = conn.notified.clone();
        let until_poll = self
            .last_query
            .map_or(Duration::ZERO, |at| self.poll.saturating_sub(at.elapsed()));
        let woke = tokio::time::timeout(until_poll.min(wait), notified.notified())
            .await
            .is_ok();
        if !woke && !due(self) {
            return Ok(Vec::new());
        }
        self.connect().await?;
        self.take_noting(max).await
    }

    /// [`OutboxSource::take`], noting when and whether it came back full.
    async fn take_noting(&mut self, max: usize) -> Result<Vec<SourceMessage>, SourceError> {
        let read = self.take(max).await?;
        self.last_query = Some(std::time::Instant::now());
        self.more = read.len() >= max;
        Ok(read)
    }

    async fn ack_now(&mut self) -> Result<(), SourceError> {
        if std::mem::take(&mut self.lost) {
            return Err(SourceError::Unavailable(format!(
                "postgres outbox `{}`: the connection was lost before the commit; the rows are read again",
                self.table
            )));
        }
        if !self.in_tx {
            return Ok(());
        }
        let ids = std::mem::take(&mut self.pending);
        let Some(conn) = &self.conn else {
            self.in_tx = false;
            return Err(SourceError::Unavailable(format!(
                "postgres outbox `{}`: the connection was lost before the commit; the rows are read again",
                self.table
            )));
        };
        let done = match conn.client.execute(&self.delete, &[&ids]).await {
            Ok(_) => conn.client.batch_execute("COMMIT").await,
            Err(e) => Err(e),
        };
        self.in_tx = false;
        match done {
            Ok(()) => Ok(()),
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    async fn lag_now(&mut self) -> Option<u64> {
        let conn = self.conn.as_ref()?;
        // An estimate from the primary key's ends: `count(*)` reads the
        // whole table. Inside an open read's transaction this is one
        // more statement of it.
        let row = conn.client.query_one(&self.lag, &[]).await;
        match row {
            Ok(row) => row
                .try_get::<_, i64>(0)
                .ok()
                .map(|n| u64::try_from(n).unwrap_or(0)),
            Err(e) => {
                let _ = self.unavailable(&e);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_messages() {
        let (id, m) = map_row(
            Ok(7),
            Ok(b"hi".to_vec()),
            Ok(Some("k".into())),
            Ok(Some(
                serde_json::json!({"a": "x", "n": 3, "o": {"p": true}}),
            )),
        )
        .expect("maps");
        assert_eq!(id, 7);
        assert_eq!(m.upstream_id, "7");
        assert_eq!(m.key.as_deref(), Some("k"));
        assert_eq!(&m.payload[..], b"hi");
        assert_eq!(
            m.headers,
            vec![
                ("a".to_owned(), "x".to_owned()),
                ("n".to_owned(), "3".to_owned()),
                ("o".to_owned(), "{\"p\":true}".to_owned()),
            ]
        );
        assert!(m.problem.is_none());

        let (_, m) = map_row(Ok(8), Ok(Vec::new()), Ok(None), Ok(None)).expect("maps");
        assert!(m.headers.is_empty() && m.key.is_none() && m.problem.is_none());

        let (_, m) = map_row(
            Ok(9),
            Ok(Vec::new()),
            Ok(None),
            Ok(Some(serde_json::json!(["a", "b"]))),
        )
        .expect("maps");
        let problem = m.problem.expect("an array is a problem");
        assert!(problem.contains("must be a JSON object"), "{problem}");
    }

    #[test]
    fn names_are_quoted_and_channels_bounded() {
        assert_eq!(quote_ident("app.outbox"), "\"app\".\"outbox\"");
        assert_eq!(channel("app.outbox"), "sluice_outbox_app_outbox");
        assert_eq!(channel(&"x".repeat(63)).len(), 63);
        let ddl = create_ddl("app.outbox");
        assert!(
            ddl.contains("CREATE TABLE IF NOT EXISTS \"app\".\"outbox\""),
            "{ddl}"
        );
        assert!(
            ddl.contains("pg_notify('sluice_outbox_app_outbox', '')"),
            "{ddl}"
        );
        assert!(
            ddl.contains("TRIGGER \"outbox_sluice_notify\" AFTER INSERT ON \"app\".\"outbox\""),
            "{ddl}"
        );
    }
}
