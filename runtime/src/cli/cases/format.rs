//! The cases file: its format (the structs are its reference and its JSON
//! Schema), reading it under a size limit, and the checks that place each
//! mistake at `file:line:col`.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::config::{Node, Pos, Seg, parse_yaml};
use crate::plugin::Message;

/// The largest cases file read: 16 MiB (payloads live in it).
const MAX_CASES_BYTES: u64 = 16 << 20;

/// A cases file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Sluice handler test cases")]
pub(crate) struct CasesFile {
    /// The stage's `config:` for every case; a case's own `config` is laid
    /// over it.
    #[serde(default, deserialize_with = "config_map")]
    #[schemars(with = "BTreeMap<String, crate::config::ConfigValue>")]
    pub config: BTreeMap<String, String>,
    /// The stage's declared `publish:` topics; the first is the default
    /// output. Without any, every topic is allowed and the default output is
    /// called `out`.
    #[serde(default)]
    pub publish: Vec<String>,
    /// The cases, run in order.
    pub cases: Vec<Case>,
}

/// One test case: a message in, what must come out.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Case {
    /// What the case shows; printed with its result.
    pub name: String,
    /// The message the handler receives.
    #[serde(default)]
    pub input: Input,
    /// Config entries for this case only, over the file's `config`.
    #[serde(default, deserialize_with = "config_map")]
    #[schemars(with = "BTreeMap<String, crate::config::ConfigValue>")]
    pub config: BTreeMap<String, String>,
    /// What the stage's state store holds before the call (`sluice:plugin/state`):
    /// key to text value. Empty when absent.
    #[serde(default)]
    pub state: BTreeMap<String, String>,
    /// The HTTP exchanges the handler makes (`wasi:http`), in any order:
    /// each request is answered by the first unused exchange that matches
    /// it. A request none matches fails in the handler and fails the case,
    /// and so does an exchange no request used.
    #[serde(default)]
    pub http: Vec<Exchange>,
    /// What the handler must do.
    pub expect: Expect,
}

/// One HTTP exchange of a case: the request matched, the answer given.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Exchange {
    /// The request it answers.
    pub request: ExchangeRequest,
    /// The answer (default `200` with an empty body).
    #[serde(default)]
    pub response: ExchangeResponse,
}

/// What a request must be to match.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExchangeRequest {
    /// Its method (`POST`); any when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// Its URL, exactly: `https://api.example.com/v1/charge?x=1`.
    pub url: String,
}

/// A scripted answer.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExchangeResponse {
    /// The status.
    #[serde(default = "ok_status")]
    pub status: u16,
    /// Its headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Its body, as text.
    #[serde(default)]
    pub body: String,
}

impl Default for ExchangeResponse {
    fn default() -> Self {
        ExchangeResponse {
            status: ok_status(),
            headers: BTreeMap::new(),
            body: String::new(),
        }
    }
}

fn ok_status() -> u16 {
    200
}

impl Case {
    /// The case's exchanges as the host's script.
    pub(crate) fn script(&self) -> crate::plugin::Script {
        crate::plugin::Script::new(
            self.http
                .iter()
                .map(|e| crate::plugin::ScriptedExchange {
                    method: e.request.method.clone(),
                    url: e.request.url.clone(),
                    status: e.response.status,
                    headers: e
                        .response
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    body: e.response.body.clone().into_bytes(),
                })
                .collect(),
        )
    }
}

/// The message a case delivers. At most one of `payload`,
/// `payload_base64` and `payload_json`; none is an empty payload.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    /// The payload, as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload, as standard base64 (for bytes that are not text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// The payload, as a JSON value written in YAML (sent as compact JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_json: Option<serde_json::Value>,
    /// The message key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Headers, in order.
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// The delivery attempt (1 = the first delivery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The message id (default `case-N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The topic the message comes from (default `test`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// What a case expects: exactly one of `emits`, `ok`, `rejected`, `retry`
/// and `fails`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Expect {
    /// The call succeeds and emits exactly these, in order (`[]`: nothing).
    #[serde(default)]
    pub emits: Option<Vec<ExpectedEmit>>,
    /// `true`: the call succeeds, whatever it emits (what a replayed dead
    /// letter expects until you say more).
    #[serde(default)]
    pub ok: Option<bool>,
    /// The handler rejects the message, with a reason matching this regular
    /// expression (`""` matches any reason).
    #[serde(default)]
    pub rejected: Option<String>,
    /// The handler asks for a retry: `true`, or `{ after_ms: N }` for a
    /// retry after exactly N ms.
    #[serde(default)]
    pub retry: Option<RetryExpect>,
    /// The call fails another way: `{ kind: trap, message: REGEX }`, kind
    /// being trap, timeout, out-of-memory, output-too-large or
    /// undeclared-topic.
    #[serde(default)]
    pub fails: Option<FailsExpect>,
    /// What the state store must hold after the call, for the keys listed:
    /// key to text value, or `null` for absent. A call that does not end
    /// `ok` commits nothing, so its store is the case's `state`.
    #[serde(default)]
    pub state: Option<BTreeMap<String, Option<String>>>,
}

/// `retry: true` or `retry: { after_ms: N }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum RetryExpect {
    /// Any retry (`true`).
    Any(bool),
    /// A retry after exactly this delay.
    After {
        /// The delay the handler must ask for, in milliseconds.
        after_ms: u64,
    },
}

/// `fails: { kind, message }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailsExpect {
    /// The failure kind, as the DLQ names it (e.g. `trap`).
    pub kind: String,
    /// A regular expression the failure's message must match.
    #[serde(default)]
    pub message: Option<String>,
}

/// Declares a struct whose fields are all read one way: a field left out
/// is `None` (not checked, and not written back), and a field given is
/// `Some`, even when its value is `null` (see [`some`]).
macro_rules! present_fields {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(
                $(#[$field_meta])*
                #[serde(
                    default,
                    deserialize_with = "some",
                    skip_serializing_if = "Option::is_none"
                )]
                pub $field: $ty,
            )*
        }
    };
}

present_fields! {
    /// One expected emit. Each field given is compared; a field left out is
    /// not checked.
    #[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct ExpectedEmit {
        /// The output topic, by name (the default output is its real name).
        pub topic: Option<String>,
        /// The key; `null` expects none.
        pub key: Option<Option<String>>,
        /// Every header, in order (`{}`: none).
        pub headers: Option<Headers>,
        /// The payload, as UTF-8 text.
        pub payload: Option<String>,
        /// The payload, as standard base64.
        pub payload_base64: Option<String>,
        /// The payload parsed as JSON equals this value (key order, spacing
        /// and how a number is written, `10` or `10.0`, do not matter; `null`
        /// expects JSON `null`).
        pub payload_json: Option<serde_json::Value>,
    }
}

/// A `config:` map as a pipeline writes it: numbers and booleans are
/// passed as their text, as a stage's `config:` does.
fn config_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let map = BTreeMap::<String, crate::config::ConfigValue>::deserialize(d)?;
    Ok(map.into_iter().map(|(k, v)| (k, v.value)).collect())
}

/// A present field, even when its value is `null`.
fn some<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Headers written as a mapping (`{ name: value }`), kept in file order.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct Headers(#[serde(serialize_with = "as_map")] pub Vec<(String, String)>);

impl Headers {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn as_map<S: serde::Serializer>(v: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(v.len()))?;
    for (k, val) in v {
        map.serialize_entry(k, val)?;
    }
    map.end()
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Headers, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Headers;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a mapping of header names to text values, or a list of [name, value] pairs \
                     (for a name that repeats)",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    out.push((k, v));
                }
                Ok(Headers(out))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = seq.next_element::<(String, String)>()? {
                    out.push((k, v));
                }
                Ok(Headers(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Headers {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Headers".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Header names to values, in order; or a list of [name, value] pairs, for a name that repeats.",
            "oneOf": [
                { "type": "object", "additionalProperties": { "type": "string" } },
                {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "prefixItems": [{ "type": "string" }, { "type": "string" }],
                        "minItems": 2,
                        "maxItems": 2
                    }
                }
            ]
        })
    }
}

/// The JSON Schema of a cases file.
pub(crate) fn json_schema() -> serde_json::Value {
    schemars::schema_for!(CasesFile).to_value()
}

/// A cases file, read and checked: each case's position and message.
pub(crate) struct Loaded {
    pub file: CasesFile,
    /// Where each case starts, for messages.
    pub positions: Vec<Pos>,
}

/// Reads and checks `path`; errors are `file:line:col: message`.
pub(crate) fn load(path: &Path) -> Result<Loaded, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if meta.len() > MAX_CASES_BYTES {
        return Err(format!(
            "{shown}: {} bytes is more than a cases file may hold ({MAX_CASES_BYTES})",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    parse(&text, &shown.to_string())
}

/// Parses and checks the text of a cases file; `shown` names it in errors.
pub(crate) fn parse(text: &str, shown: &str) -> Result<Loaded, String> {
    if text.len() as u64 > MAX_CASES_BYTES {
        return Err(format!(
            "{shown}: {} bytes is more than a cases file may hold ({MAX_CASES_BYTES})",
            text.len()
        ));
    }
    let (file, tree): (CasesFile, Node) = parse_yaml(text)
        .map_err(|(pos, msg)| format!("{shown}:{}:{}: {msg}", pos.line, pos.col))?;
    let at = |path: &[Seg<'_>]| {
        let pos = tree.locate(path);
        format!("{shown}:{}:{}", pos.line, pos.col)
    };
    if file.cases.is_empty() {
        return Err(format!(
            "{}: the file has no cases",
            at(&[Seg::Key("cases")])
        ));
    }
    for (i, case) in file.cases.iter().enumerate() {
        let here = [Seg::Key("cases"), Seg::Index(i)];
        let input = &case.input;
        check_payload(
            input.payload.is_some(),
            input.payload_json.is_some(),
            input.payload_base64.as_deref(),
        )
        .map_err(|e| format!("{}: {e}", at(&[here[0], here[1], Seg::Key("input")])))?;
        let e = &case.expect;
        if e.ok == Some(false) {
            return Err(format!(
                "{}: `ok: false` expects nothing; say which failure with `rejected`, `retry` or `fails`",
                at(&[here[0], here[1], Seg::Key("expect"), Seg::Key("ok")])
            ));
        }
        let given = [
            e.emits.is_some(),
            e.ok.is_some(),
            e.rejected.is_some(),
            e.retry.is_some(),
            e.fails.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(format!(
                "{}: `expect` needs exactly one of `emits`, `ok`, `rejected`, `retry` and `fails`",
                at(&[here[0], here[1], Seg::Key("expect")])
            ));
        }
        for pattern in [
            e.rejected.as_ref(),
            e.fails.as_ref().and_then(|f| f.message.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            regex::Regex::new(pattern).map_err(|err| {
                format!(
                    "{}: not a regular expression: {err}",
                    at(&[here[0], here[1], Seg::Key("expect")])
                )
            })?;
        }
        if let Some(f) = &e.fails
            && !FAIL_KINDS.contains(&f.kind.as_str())
        {
            return Err(format!(
                "{}: unknown failure kind `{}`; one of {}",
                at(&[
                    here[0],
                    here[1],
                    Seg::Key("expect"),
                    Seg::Key("fails"),
                    Seg::Key("kind")
                ]),
                f.kind,
                FAIL_KINDS.join(", ")
            ));
        }
        for (j, emit) in e.emits.iter().flatten().enumerate() {
            check_payload(
                emit.payload.is_some(),
                emit.payload_json.is_some(),
                emit.payload_base64.as_deref(),
            )
            .map_err(|err| {
                let emits = [Seg::Key("expect"), Seg::Key("emits"), Seg::Index(j)];
                format!("{}: {err}", at(&[&here[..], &emits].concat()))
            })?;
        }
    }
    let positions = (0..file.cases.len())
        .map(|i| tree.locate(&[Seg::Key("cases"), Seg::Index(i)]))
        .collect();
    Ok(Loaded { file, positions })
}

/// At most one payload form is given (`text` and `json` say whether those
/// two are), and base64 decodes.
fn check_payload(text: bool, json: bool, base64: Option<&str>) -> Result<(), String> {
    let given = usize::from(text) + usize::from(json) + usize::from(base64.is_some());
    if given > 1 {
        return Err("give one of `payload`, `payload_base64` and `payload_json`".into());
    }
    base64.map_or(Ok(()), |b| decode_base64(b).map(drop))
}

/// The kinds `fails:` may name.
const FAIL_KINDS: &[&str] = &[
    "trap",
    "timeout",
    "out-of-memory",
    "output-too-large",
    "undeclared-topic",
];

pub(super) fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("not standard base64: {e}"))
}

impl Input {
    /// The message this input describes; `n` numbers the default id.
    pub fn message(&self, n: usize, published_at: u64) -> Message {
        let payload = if let Some(p) = &self.payload {
            p.clone().into_bytes()
        } else if let Some(b) = &self.payload_base64 {
            decode_base64(b).unwrap_or_default()
        } else if let Some(j) = &self.payload_json {
            j.to_string().into_bytes()
        } else {
            Vec::new()
        };
        Message {
            id: self.id.clone().unwrap_or_else(|| format!("case-{n}")),
            topic: self.topic.clone().unwrap_or_else(|| "test".into()),
            key: self.key.clone(),
            headers: self.headers.0.clone(),
            payload,
            attempt: self.attempt.unwrap_or(1),
            published_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Loaded, String> {
        let dir = tempfile::tempdir().expect("test step");
        let path = dir.path().join("cases.yaml");
        std::fs::write(&path, text).expect("test step");
        load(&path).map_err(|e| e.replace(&path.display().to_string(), "F"))
    }

    #[test]
    fn a_case_file_is_read_with_headers_in_order_and_each_payload_form() {
        let loaded = load_text(
            "publish: [out]\ncases:\n  - name: a\n    input: { payload_json: {x: 1}, headers: { z: '1', a: '2' } }\n    expect: { emits: [] }\n  - name: b\n    input: { payload_base64: '/w==' }\n    expect: { retry: { after_ms: 5 } }\n",
        )
        .expect("test step");
        let m = loaded.file.cases[0].input.message(1, 0);
        assert_eq!(m.payload, br#"{"x":1}"#);
        assert_eq!(
            m.headers,
            vec![("z".into(), "1".into()), ("a".into(), "2".into())]
        );
        assert_eq!(loaded.file.cases[1].input.message(2, 0).payload, vec![0xff]);
        assert_eq!(loaded.positions[1].line, 6);
    }

    #[test]
    fn bad_files_are_refused_at_the_place() {
        for (text, want) in [
            ("cases: []\n", "F:1:8: the file has no cases"),
            (
                "cases:\n  - name: a\n    expect: {}\n",
                "F:3:13: `expect` needs exactly one",
            ),
            (
                "cases:\n  - name: a\n    expect: { emits: [], retry: true }\n",
                "exactly one",
            ),
            (
                "cases:\n  - name: a\n    input: { payload: x, payload_base64: eA== }\n    expect: { retry: true }\n",
                "F:3:12: give one of",
            ),
            (
                "cases:\n  - name: a\n    input: { bogus: 1 }\n    expect: { retry: true }\n",
                "F:3:14: unknown field `bogus`",
            ),
            (
                "cases:\n  - name: a\n    expect: { rejected: '(' }\n",
                "not a regular expression",
            ),
            (
                "cases:\n  - name: a\n    expect: { fails: { kind: boom } }\n",
                "unknown failure kind `boom`",
            ),
            (
                "cases:\n  - name: a\n    input: { payload_base64: '***' }\n    expect: { retry: true }\n",
                "not standard base64",
            ),
        ] {
            let err = load_text(text)
                .err()
                .unwrap_or_else(|| panic!("accepted: {text}"));
            assert!(err.contains(want), "{text}\n=> {err}\nwanted {want}");
        }
    }

    #[test]
    fn headers_that_repeat_config_numbers_and_nulls() {
        let loaded = load_text(
            "config: { n: 3, on: true }\ncases:\n  - name: a\n    input: { headers: [[x, '1'], [x, '2']] }\n    config: { ratio: 0.5 }\n    expect: { emits: [{ headers: [[x, '1'], [x, '2']], payload_json: null }] }\n",
        )
        .expect("test step");
        let file = &loaded.file;
        assert_eq!(file.config.get("n").map(String::as_str), Some("3"));
        assert_eq!(file.config.get("on").map(String::as_str), Some("true"));
        assert_eq!(
            file.cases[0].config.get("ratio").map(String::as_str),
            Some("0.5")
        );
        let repeated = vec![
            ("x".to_owned(), "1".to_owned()),
            ("x".to_owned(), "2".to_owned()),
        ];
        assert_eq!(file.cases[0].input.headers.0, repeated);
        let Some(emits) = &file.cases[0].expect.emits else {
            panic!("emits");
        };
        assert_eq!(emits[0].headers.as_ref().map(|h| &h.0), Some(&repeated));
        assert_eq!(emits[0].payload_json, Some(serde_json::Value::Null));
        // `null` where it cannot mean "none" is refused, not skipped.
        for field in ["headers", "payload", "topic"] {
            let err = load_text(&format!(
                "cases:\n  - name: a\n    expect: {{ emits: [{{ {field}: null }}] }}\n"
            ))
            .err()
            .unwrap_or_else(|| panic!("{field}: null was taken"));
            assert!(err.starts_with("F:3:"), "{field}: {err}");
        }
    }
}
