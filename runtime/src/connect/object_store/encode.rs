//! A file's bytes: JSON lines (plain, gzip or zstd) or Parquet (columns
//! from the block's schema), built as records arrive and finished when
//! the file rolls; and the check of a message against a Parquet schema,
//! so a message that does not fit is refused whole, never written half.
//!
//! A file is written through to a spool file (`spool.rs`) as it grows:
//! Parquet's writer keeps only the row group being filled in memory and
//! writes each finished one out, and a compressor writes what it emits.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use base64::Engine as _;
use parquet::arrow::ArrowWriter;
use parquet::basic::ZstdLevel;
use parquet::file::properties::WriterProperties;
use serde_json::Value;

use super::config::{Compression, ObjectFormat, ObjectStoreSinkConfig, SchemaField};
use super::spool::{SpoolFile, Spooled};
use crate::connect::SinkError;
use crate::plugin::Message;

/// Rows per Parquet row group: a row group is buffered in memory until it
/// is full (or the file closes), so this and [`ROW_GROUP_BYTES`] bound
/// the writer's memory; the finished ones are on the spool. parquet's own
/// default (1,048,576 rows, no byte limit) would hold a 256 MB file in
/// memory whole.
pub(super) const ROW_GROUP_ROWS: usize = 64 * 1024;

/// A row group's estimated encoded size at which it is written out,
/// whatever its rows: large records fill one before [`ROW_GROUP_ROWS`].
pub(super) const ROW_GROUP_BYTES: usize = 64 << 20;

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
pub(super) enum FileError {
    /// Writing the spool file failed (a full disk, above all): an outage,
    /// the records wait.
    #[error("writing the spool file: {0}")]
    Spool(String),
    /// The records could not be encoded (a bug): they count an attempt.
    #[error("{0}")]
    Encode(String),
}

impl FileError {
    /// The records' outcome.
    pub(super) fn to_sink_error(&self) -> SinkError {
        match self {
            FileError::Spool(_) => SinkError::Unavailable(self.to_string()),
            FileError::Encode(_) => SinkError::Retry {
                reason: self.to_string(),
                after: None,
            },
        }
    }
}

/// The columns every Parquet file starts with.
const OWN_COLUMNS: [&str; 3] = ["sluice_id", "sluice_key", "sluice_published_at"];

/// A Parquet schema: the block's columns, in name order after the sink's
/// own three, and how each is read from a JSON payload.
#[derive(Debug)]
pub(super) struct Columns {
    schema: Arc<Schema>,
    /// The block's columns (without the sink's own), in schema order.
    fields: Vec<Column>,
}

#[derive(Debug)]
struct Column {
    name: String,
    kind: DataType,
    nullable: bool,
}

/// One message's values for the block's columns, checked.
pub(super) type Row = Vec<Value>;

impl Columns {
    /// The columns of `schema` (type names already checked by `validate`).
    pub(super) fn new(
        schema: &std::collections::BTreeMap<String, SchemaField>,
    ) -> Result<Self, String> {
        let mut fields = Vec::with_capacity(schema.len());
        for (name, field) in schema {
            let kind = match field.kind() {
                "string" => DataType::Utf8,
                "int32" => DataType::Int32,
                "int64" => DataType::Int64,
                "float32" => DataType::Float32,
                "float64" => DataType::Float64,
                "bool" => DataType::Boolean,
                "timestamp_ms" => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                "binary" => DataType::Binary,
                other => return Err(format!("column `{name}`: `{other}` is not a column type")),
            };
            fields.push(Column {
                name: name.clone(),
                kind,
                nullable: field.nullable(),
            });
        }
        let mut all = vec![
            Field::new(OWN_COLUMNS[0], DataType::Utf8, false),
            Field::new(OWN_COLUMNS[1], DataType::Utf8, true),
            Field::new(
                OWN_COLUMNS[2],
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                false,
            ),
        ];
        all.extend(
            fields
                .iter()
                .map(|c| Field::new(&c.name, c.kind.clone(), c.nullable)),
        );
        Ok(Columns {
            schema: Arc::new(Schema::new(all)),
            fields,
        })
    }

    /// The message's values for the columns, or why it does not fit,
    /// naming the field: a payload that is not a JSON object, a missing
    /// or null value of a non-nullable column, a value of the wrong type.
    pub(super) fn row(&self, message: &Message) -> Result<Row, String> {
        let payload: Value = serde_json::from_slice(&message.payload)
            .map_err(|e| format!("the payload is not JSON ({e}); parquet needs a JSON object"))?;
        let Value::Object(mut object) = payload else {
            return Err("the payload is not a JSON object; parquet needs one".into());
        };
        let mut row = Vec::with_capacity(self.fields.len());
        for column in &self.fields {
            let value = object.remove(&column.name).unwrap_or(Value::Null);
            if value.is_null() {
                if !column.nullable {
                    return Err(format!(
                        "field `{}`: missing or null, and the column is not nullable",
                        column.name
                    ));
                }
            } else if let Err(why) = fits(&column.kind, &value) {
                return Err(format!("field `{}`: {why}", column.name));
            }
            row.push(value);
        }
        Ok(row)
    }

    /// The record batch of checked rows.
    fn batch(&self, rows: &[(&Message, Row)]) -> Result<RecordBatch, String> {
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.fields.len() + 3);
        let mut ids = StringBuilder::new();
        let mut keys = StringBuilder::new();
        let mut times = TimestampMillisecondBuilder::new().with_timezone("UTC");
        for (message, _) in rows {
            ids.append_value(&message.id);
            keys.append_option(message.key.as_deref());
            times.append_value(i64::try_from(message.published_at).unwrap_or(i64::MAX));
        }
        arrays.push(Arc::new(ids.finish()));
        arrays.push(Arc::new(keys.finish()));
        arrays.push(Arc::new(times.finish()));
        for (i, column) in self.fields.iter().enumerate() {
            let values = rows.iter().map(|(_, row)| &row[i]);
            arrays.push(build_array(&column.kind, values));
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| e.to_string())
    }
}

/// Whether a JSON value (not null) reads as a column of `kind`.
fn fits(kind: &DataType, value: &Value) -> Result<(), String> {
    let ok = match kind {
        DataType::Utf8 => value.is_string(),
        DataType::Int32 => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
        DataType::Int64 => value.as_i64().is_some(),
        DataType::Float32 | DataType::Float64 => value.is_number(),
        DataType::Boolean => value.is_boolean(),
        DataType::Timestamp(..) => timestamp_ms(value).is_some(),
        DataType::Binary => value
            .as_str()
            .is_some_and(|s| base64::engine::general_purpose::STANDARD.decode(s).is_ok()),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        let shown: String = value.to_string().chars().take(60).collect();
        Err(format!("{shown} is not {}", expected(kind)))
    }
}

fn expected(kind: &DataType) -> &'static str {
    match kind {
        DataType::Utf8 => "a string",
        DataType::Int32 => "an integer that fits in 32 bits (int32)",
        DataType::Int64 => "an integer (int64)",
        DataType::Float32 | DataType::Float64 => "a number",
        DataType::Boolean => "true or false",
        DataType::Timestamp(..) => {
            "a time (ms since the Unix epoch, or RFC 3339 text) for timestamp_ms"
        }
        DataType::Binary => "base64 text (binary)",
        _ => "a supported value",
    }
}

/// A `timestamp_ms` value: ms since the epoch, or RFC 3339 text.
fn timestamp_ms(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => crate::timestamp::parse_rfc3339_millis(s)
            .ok()
            .and_then(|ms| i64::try_from(ms).ok()),
        _ => None,
    }
}

/// One column's array from checked values (null where the value is).
fn build_array<'a>(kind: &DataType, values: impl Iterator<Item = &'a Value>) -> ArrayRef {
    macro_rules! column {
        ($builder:expr, $read:expr) => {{
            let mut builder = $builder;
            for value in values {
                builder.append_option(if value.is_null() { None } else { $read(value) });
            }
            Arc::new(builder.finish())
        }};
    }
    match kind {
        DataType::Int32 => column!(Int32Builder::new(), |v: &Value| v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())),
        DataType::Int64 => column!(Int64Builder::new(), |v: &Value| v.as_i64()),
        #[allow(clippy::cast_possible_truncation, reason = "float32 is asked for")]
        DataType::Float32 => column!(Float32Builder::new(), |v: &Value| v
            .as_f64()
            .map(|f| f as f32)),
        DataType::Float64 => column!(Float64Builder::new(), |v: &Value| v.as_f64()),
        DataType::Boolean => column!(BooleanBuilder::new(), |v: &Value| v.as_bool()),
        DataType::Timestamp(..) => column!(
            TimestampMillisecondBuilder::new().with_timezone("UTC"),
            timestamp_ms
        ),
        DataType::Binary => column!(BinaryBuilder::new(), |v: &Value| v
            .as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())),
        _ => column!(StringBuilder::new(), |v: &Value| v
            .as_str()
            .map(str::to_owned)),
    }
}

/// A file being written.
pub(super) enum Encoder {
    /// JSON lines into a spool file, through the compressor if any.
    Jsonl(Lines),
    /// A Parquet writer over a spool file.
    Parquet(Box<ArrowWriter<SpoolFile>>, Arc<Columns>),
}

/// JSON lines, compressed or not.
pub(super) enum Lines {
    Plain(SpoolFile),
    Gzip(flate2::write::GzEncoder<SpoolFile>),
    Zstd(zstd::stream::write::Encoder<'static, SpoolFile>),
}

impl Encoder {
    /// An empty file of the block's format (not `raw`, which has none),
    /// written to `out`.
    pub(super) fn new(
        config: &ObjectStoreSinkConfig,
        columns: Option<&Arc<Columns>>,
        out: SpoolFile,
    ) -> Result<Self, FileError> {
        match (config.format, columns) {
            (ObjectFormat::Parquet, Some(columns)) => {
                let compression = match config.compression {
                    Some(Compression::Snappy) => parquet::basic::Compression::SNAPPY,
                    Some(Compression::Zstd) => {
                        parquet::basic::Compression::ZSTD(ZstdLevel::default())
                    }
                    _ => parquet::basic::Compression::UNCOMPRESSED,
                };
                let properties = WriterProperties::builder()
                    .set_compression(compression)
                    .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                    .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
                    .build();
                let writer = ArrowWriter::try_new(out, columns.schema.clone(), Some(properties))
                    .map_err(|e| FileError::Spool(format!("starting a parquet file: {e}")))?;
                Ok(Encoder::Parquet(Box::new(writer), columns.clone()))
            }
            (ObjectFormat::Jsonl, _) => Ok(Encoder::Jsonl(match config.compression {
                Some(Compression::Gzip) => Lines::Gzip(flate2::write::GzEncoder::new(
                    out,
                    flate2::Compression::default(),
                )),
                Some(Compression::Zstd) => Lines::Zstd(
                    zstd::stream::write::Encoder::new(out, 3)
                        .map_err(|e| FileError::Spool(format!("starting a zstd stream: {e}")))?,
                ),
                _ => Lines::Plain(out),
            })),
            _ => Err(FileError::Encode("this format writes no files".into())),
        }
    }

    /// Appends records. For Parquet, `rows` holds each message's checked
    /// values; for JSON lines it is empty.
    ///
    /// # Errors
    ///
    /// [`FileError::Spool`] for a failed write (the writer's errors are
    /// taken as the spool's: the batch was built from checked rows, and
    /// encoding it cannot fail otherwise).
    pub(super) fn append(&mut self, messages: &[(&Message, Row)]) -> Result<(), FileError> {
        match self {
            Encoder::Parquet(writer, columns) => {
                let batch = columns.batch(messages).map_err(FileError::Encode)?;
                writer
                    .write(&batch)
                    .map_err(|e| FileError::Spool(format!("writing parquet: {e}")))
            }
            Encoder::Jsonl(lines) => {
                for (message, _) in messages {
                    let line = json_line(message);
                    let written = match lines {
                        Lines::Plain(buf) => buf.write_all(&line),
                        Lines::Gzip(gz) => gz.write_all(&line),
                        Lines::Zstd(z) => z.write_all(&line),
                    };
                    written.map_err(|e| FileError::Spool(e.to_string()))?;
                }
                // A compressor holds back what it has not emitted yet; a
                // flush per append (a batch) makes the file's size, which
                // `max_bytes` is checked against, what it has taken.
                let flushed = match lines {
                    Lines::Plain(_) => Ok(()),
                    Lines::Gzip(gz) => gz.flush(),
                    Lines::Zstd(z) => z.flush(),
                };
                flushed.map_err(|e| FileError::Spool(e.to_string()))
            }
        }
    }

    /// The bytes written so far, as encoded (for Parquet, with the row
    /// group still in memory estimated).
    pub(super) fn size(&self) -> u64 {
        let size = match self {
            Encoder::Parquet(writer, _) => writer.bytes_written() + writer.in_progress_size(),
            Encoder::Jsonl(Lines::Plain(out)) => return out.written(),
            Encoder::Jsonl(Lines::Gzip(gz)) => return gz.get_ref().written(),
            Encoder::Jsonl(Lines::Zstd(z)) => return z.get_ref().written(),
        };
        u64::try_from(size).unwrap_or(u64::MAX)
    }

    /// The whole file, on the spool.
    pub(super) fn finish(self) -> Result<Spooled, FileError> {
        let spool = |e: std::io::Error| FileError::Spool(e.to_string());
        let out = match self {
            Encoder::Parquet(writer, _) => writer
                .into_inner()
                .map_err(|e| FileError::Spool(format!("finishing the parquet file: {e}")))?,
            Encoder::Jsonl(Lines::Plain(out)) => out,
            Encoder::Jsonl(Lines::Gzip(gz)) => gz.finish().map_err(spool)?,
            Encoder::Jsonl(Lines::Zstd(z)) => z.finish().map_err(spool)?,
        };
        out.finish().map_err(spool)
    }
}

/// One message as a JSON line: `id`, `topic`, `key`, `headers` (an object;
/// a repeated header keeps its last value), `published_at` (RFC 3339, ms)
/// and the payload, as `payload` when it is JSON, else `payload_base64`.
pub(crate) fn json_line(message: &Message) -> Vec<u8> {
    let mut object = serde_json::Map::with_capacity(7);
    object.insert("id".into(), Value::String(message.id.clone()));
    object.insert("topic".into(), Value::String(message.topic.clone()));
    object.insert(
        "key".into(),
        message.key.clone().map_or(Value::Null, Value::String),
    );
    let headers = message
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), Value::String(value.clone())))
        .collect();
    object.insert("headers".into(), Value::Object(headers));
    object.insert(
        "published_at".into(),
        Value::String(crate::timestamp::format_rfc3339_millis(
            message.published_at,
        )),
    );
    match serde_json::from_slice::<Value>(&message.payload) {
        Ok(payload) => {
            object.insert("payload".into(), payload);
        }
        Err(_) => {
            object.insert(
                "payload_base64".into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(&message.payload)),
            );
        }
    }
    let mut line = serde_json::to_vec(&Value::Object(object)).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, payload: &str) -> Message {
        Message {
            id: id.into(),
            topic: "t".into(),
            key: Some("k".into()),
            headers: vec![("h".into(), "v".into())],
            payload: payload.as_bytes().to_vec(),
            attempt: 1,
            published_at: 1_700_000_000_123,
        }
    }

    fn columns(yaml: &str) -> Columns {
        let schema: std::collections::BTreeMap<String, SchemaField> =
            serde_saphyr::from_str(yaml).expect("schema");
        Columns::new(&schema).expect("columns")
    }

    #[test]
    fn a_message_that_does_not_fit_is_refused_naming_the_field() {
        let c = columns("qty: {type: int64, nullable: false}\nname: string\nat: timestamp_ms\n");
        assert!(c.row(&message("a", r#"{"qty": 3, "name": "x"}"#)).is_ok());
        let why = c
            .row(&message("b", r#"{"qty": "3"}"#))
            .expect_err("a string");
        assert!(
            why.contains("field `qty`") && why.contains("int64"),
            "{why}"
        );
        let why = c
            .row(&message("c", r#"{"name": "x"}"#))
            .expect_err("missing");
        assert!(why.contains("field `qty`: missing"), "{why}");
        let why = c.row(&message("d", "not json")).expect_err("not json");
        assert!(why.contains("not JSON"), "{why}");
        let why = c
            .row(&message("e", r#"{"qty": 1, "at": "yesterday"}"#))
            .expect_err("bad time");
        assert!(why.contains("field `at`"), "{why}");
    }

    #[test]
    fn json_lines_carry_the_payload_as_json_or_base64() {
        let line = json_line(&message("a", r#"{"x": 1}"#));
        let v: Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(v["payload"]["x"], 1);
        assert_eq!(v["id"], "a");
        assert_eq!(v["headers"]["h"], "v");
        assert_eq!(v["published_at"], "2023-11-14T22:13:20.123Z");
        let line = json_line(&message("b", "\u{1}raw"));
        let v: Value = serde_json::from_slice(&line).expect("json");
        assert!(v.get("payload").is_none());
        assert_eq!(v["payload_base64"], "AXJhdw==");
    }

    #[test]
    fn a_parquet_file_holds_the_rows_and_the_sinks_own_columns() {
        let c = Arc::new(columns("qty: int64\nprice: float64\n"));
        let config: ObjectStoreSinkConfig = serde_saphyr::from_str(
            "store: file:///x\nformat: parquet\ncompression: zstd\nschema: {qty: int64}\n",
        )
        .expect("block");
        let root = tempfile::tempdir().expect("dir");
        let (spool, _) = super::super::spool::Spool::open(root.path()).expect("spool");
        let out = spool.create().expect("spool file");
        let mut encoder = Encoder::new(&config, Some(&c), out).expect("encoder");
        let (a, b) = (
            message("a", r#"{"qty": 1, "price": 2.5}"#),
            message("b", r#"{"qty": null}"#),
        );
        let rows = vec![
            (&a, c.row(&a).expect("fits")),
            (&b, c.row(&b).expect("fits")),
        ];
        encoder.append(&rows).expect("append");
        let spooled = encoder.finish().expect("finish");
        let bytes = std::fs::read(&spooled.path).expect("read");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .expect("reader")
        .build()
        .expect("build");
        let batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 2);
        let names: Vec<String> = batches[0]
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(
            names,
            [
                "sluice_id",
                "sluice_key",
                "sluice_published_at",
                "price",
                "qty"
            ]
        );
    }
}
