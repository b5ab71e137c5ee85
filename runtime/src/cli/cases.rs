//! `sluice plugin test --cases FILE`: handler test vectors, in the spirit of
//! `smdk test` and `rpk connect test`. The file format is documented in
//! `docs/cases.md`, and `sluice schema --cases` prints its JSON Schema.
//!
//! ```yaml
//! config: { suffix: "!" }         # the stage's config:, for every case
//! publish: [out, audit]           # declared outputs; the first is the default
//! cases:
//!   - name: upper-cases text
//!     input: { payload: hello, key: k1, headers: { source: demo }, attempt: 1 }
//!     expect:
//!       emits:
//!         - { payload: "HELLO!", key: k1 }
//!   - name: rejects an empty payload
//!     input: { payload: "" }
//!     expect: { rejected: "empty" }
//! ```
//!
//! Each case runs in a fresh instance, under the daemon's sandbox and
//! limits. A mismatch prints what was expected beside what happened, and
//! the command exits 1.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::admin::DlqEntryDetail;
use crate::config::{Node, Pos, Seg, parse_yaml};
use crate::failure::{Failure, FailureKind};
use crate::plugin::{Emit, Message};

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

/// The differences between a case's exchanges and the requests made.
pub(crate) fn check_http(script: &crate::plugin::Script) -> Option<String> {
    let mut diff = String::new();
    for request in script.unexpected() {
        let _ = writeln!(
            diff,
            "      http: unexpected request {request} (no exchange matches it)"
        );
    }
    for exchange in script.unused() {
        let _ = writeln!(diff, "      http: expected request {exchange} was not made");
    }
    (!diff.is_empty()).then(|| diff.trim_end().to_owned())
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

/// One expected emit. Each field given is compared; a field left out is
/// not checked.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpectedEmit {
    /// The output topic, by name (the default output is its real name).
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub topic: Option<String>,
    /// The key; `null` expects none.
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub key: Option<Option<String>>,
    /// Every header, in order (`{}`: none).
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub headers: Option<Headers>,
    /// The payload, as UTF-8 text.
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub payload: Option<String>,
    /// The payload, as standard base64.
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub payload_base64: Option<String>,
    /// The payload parsed as JSON equals this value (key order, spacing
    /// and how a number is written, `10` or `10.0`, do not matter; `null`
    /// expects JSON `null`).
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub payload_json: Option<serde_json::Value>,
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
    fn is_empty(&self) -> bool {
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

impl Loaded {
    /// One case for a replay of the dead letter `seq` of `stage`: the
    /// message as its handler saw it, expected to succeed now.
    pub fn dead_letter(stage: &str, seq: u64, entry: &DlqEntryDetail) -> Loaded {
        let case = Case {
            name: format!("dead letter {stage}/{seq} ({})", entry.summary.id),
            input: dlq_input(entry),
            config: BTreeMap::new(),
            state: BTreeMap::new(),
            http: Vec::new(),
            expect: Expect {
                ok: Some(true),
                ..Expect::default()
            },
        };
        Loaded {
            file: CasesFile {
                config: BTreeMap::new(),
                publish: Vec::new(),
                cases: vec![case],
            },
            positions: vec![Pos { line: 1, col: 1 }],
        }
    }
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

fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
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

/// Why a dead letter cannot become a case, if it cannot: its payload is a
/// claim-check reference (the bytes are in the claim store, and the case
/// would replay an empty payload).
pub(crate) fn dlq_case_refusal(stage: &str, seq: u64, entry: &DlqEntryDetail) -> Option<String> {
    let reference = entry
        .headers
        .iter()
        .find(|(k, _)| k == crate::claim::CLAIM_HEADER)?;
    Some(format!(
        "dead letter {seq} of {stage} holds a claim-check reference ({}), not its payload: \
         the bytes are in the claim store, and a case would replay an empty payload. Fetch \
         the object and write the case by hand, or redrive the dead letter through the \
         pipeline (`sluice dlq redrive`)",
        reference.1
    ))
}

/// The message a dead letter held, as its handler saw it: the original id,
/// the source topic, the last attempt, and the producer's headers (the
/// `sluice-` provenance headers are the runtime's, not the handler's).
pub(crate) fn dlq_input(entry: &DlqEntryDetail) -> Input {
    let header = |name: &str| {
        entry
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    Input {
        payload: entry.payload.clone(),
        payload_base64: entry.payload_base64.clone(),
        payload_json: None,
        key: entry.summary.key.clone(),
        headers: Headers(
            entry
                .headers
                .iter()
                .filter(|(k, _)| !k.starts_with("sluice-"))
                .cloned()
                .collect(),
        ),
        attempt: entry.summary.attempts,
        id: header(crate::dlq::ORIGINAL_ID).or_else(|| Some(entry.summary.id.clone())),
        topic: entry.summary.source_topic.clone(),
    }
}

/// What a dead letter's failure was, in one line.
pub(crate) fn dlq_failure(entry: &DlqEntryDetail) -> String {
    let error = entry.summary.error.as_deref().unwrap_or("");
    let first = error.lines().next().unwrap_or("");
    format!(
        "{} after {} attempt(s): {first}{}",
        entry.summary.kind.as_deref().unwrap_or("failed"),
        entry.summary.attempts.unwrap_or(0),
        if error.lines().count() > 1 {
            " ..."
        } else {
            ""
        }
    )
}

/// `text` as a YAML double-quoted scalar: a JSON string (which YAML reads
/// as one), with DEL and the C1 controls escaped too, since YAML refuses
/// them unescaped and JSON does not escape them.
fn yaml_quoted(text: &str) -> String {
    let json = serde_json::Value::from(text).to_string();
    if !json
        .chars()
        .any(|c| c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c))
    {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// A dead letter as one case, in YAML: a list item to append under a cases
/// file's `cases:`, expecting success (`ok: true`) until the author says
/// what the fixed handler must emit.
/// The state a dead letter's case starts from: the keys its last attempt
/// read ([`crate::dlq::STATE_READ`]), with their values as the store holds
/// them now.
#[derive(Debug, Default)]
pub(crate) struct CaseState {
    /// Each key with its value as text; `None` when it is absent now, not
    /// text, or withheld.
    pub values: Vec<(String, Option<String>)>,
    /// Why values are left out (the read token), if they are.
    pub withheld: Option<String>,
    /// Keys the attempt read beyond those the dead letter names.
    pub more: usize,
}

pub(crate) fn dlq_case_yaml(
    stage: &str,
    seq: u64,
    entry: &DlqEntryDetail,
    state: &CaseState,
) -> String {
    let input = dlq_input(entry);
    let q = yaml_quoted;
    let mut y = String::new();
    let _ = writeln!(
        y,
        "  # dead letter {seq} of {stage}: {}",
        one_line(&dlq_failure(entry))
    );
    let _ = writeln!(
        y,
        "  # (edit `expect` to what the fixed handler must do; `ok: true` passes on any success)"
    );
    let _ = writeln!(
        y,
        "  - name: {}",
        q(&format!("dead letter {stage} {seq} ({})", entry.summary.id))
    );
    let _ = writeln!(y, "    input:");
    if let Some(p) = &input.payload {
        let _ = writeln!(y, "      payload: {}", q(p));
    }
    if let Some(p) = &input.payload_base64 {
        let _ = writeln!(y, "      payload_base64: {}", q(p));
    }
    if let Some(k) = &input.key {
        let _ = writeln!(y, "      key: {}", q(k));
    }
    if !input.headers.is_empty() {
        let _ = writeln!(y, "      headers:");
        let names: std::collections::BTreeSet<&str> =
            input.headers.0.iter().map(|(k, _)| k.as_str()).collect();
        let repeats = names.len() < input.headers.0.len();
        for (k, v) in &input.headers.0 {
            if repeats {
                let _ = writeln!(y, "        - [{}, {}]", q(k), q(v));
            } else {
                let _ = writeln!(y, "        {}: {}", q(k), q(v));
            }
        }
    }
    if let Some(a) = input.attempt {
        let _ = writeln!(y, "      attempt: {a}");
    }
    if let Some(id) = &input.id {
        let _ = writeln!(y, "      id: {}", q(id));
    }
    if let Some(t) = &input.topic {
        let _ = writeln!(y, "      topic: {}", q(t));
    }
    if !state.values.is_empty() {
        let _ = writeln!(
            y,
            "    # the state keys the last attempt read, with their values as the store holds them now"
        );
        if let Some(why) = &state.withheld {
            let _ = writeln!(y, "    # values left out: {}", one_line(why));
        }
        if state.more > 0 {
            let _ = writeln!(
                y,
                "    # and {} more keys the dead letter does not name",
                state.more
            );
        }
        let _ = writeln!(y, "    state:");
        for (key, value) in &state.values {
            match value {
                Some(v) => {
                    let _ = writeln!(y, "      {}: {}", q(key), q(v));
                }
                None => {
                    let _ = writeln!(y, "      # {}: (absent, not text, or withheld)", q(key));
                }
            }
        }
    }
    let _ = writeln!(y, "    expect: {{ ok: true }}");
    y
}

/// `text` on one line, shortened.
fn one_line(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.chars().count() > 160 {
        line.chars().take(160).collect::<String>() + "..."
    } else {
        line
    }
}

/// What a case's call did, against what it expected: None when it passed,
/// else the explanation (several lines).
/// What differs between the store after a call and what the case expects
/// of it (only the keys it lists), or None.
pub(crate) fn check_state(expect: &Expect, got: &BTreeMap<String, Vec<u8>>) -> Option<String> {
    let want = expect.state.as_ref()?;
    let mut diffs = String::new();
    for (key, value) in want {
        let found = got
            .get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned());
        if found != *value {
            let _ = writeln!(
                diffs,
                "      state `{key}`: expected {}, got {}",
                value
                    .as_deref()
                    .map_or("absent".to_owned(), |v| format!("{v:?}")),
                found.map_or("absent".to_owned(), |v| format!("{v:?}"))
            );
        }
    }
    (!diffs.is_empty()).then_some(diffs)
}

pub(crate) fn check(expect: &Expect, got: &Result<Vec<Emit>, Failure>) -> Option<String> {
    match (expect, got) {
        (
            Expect {
                emits: Some(want), ..
            },
            Ok(emits),
        ) => check_emits(want, emits),
        (Expect { ok: Some(true), .. }, Ok(_)) => None,
        (
            Expect {
                rejected: Some(pattern),
                ..
            },
            Err(f),
        ) if f.kind == FailureKind::Rejected => {
            let re = regex::Regex::new(pattern).ok()?;
            (!re.is_match(&f.message)).then(|| {
                format!(
                    "  the reason does not match\n  - expected rejected: /{pattern}/\n  + actual   rejected: {:?}",
                    f.message
                )
            })
        }
        (Expect { retry: Some(r), .. }, Err(f)) if f.kind == FailureKind::Retry => match r {
            RetryExpect::Any(true) => None,
            RetryExpect::Any(false) => {
                Some("  `retry: false` expects nothing; use `emits` or `rejected`".into())
            }
            RetryExpect::After { after_ms } => {
                let got = f.retry_after.map(|d| d.as_millis() as u64);
                (got != Some(*after_ms)).then(|| {
                    format!(
                        "  the retry delay differs\n  - expected retry after: {after_ms} ms\n  + actual   retry after: {}",
                        got.map_or("the stage's backoff".into(), |ms| format!("{ms} ms"))
                    )
                })
            }
        },
        (
            Expect {
                fails: Some(fe), ..
            },
            Err(f),
        ) if f.kind.to_string() == fe.kind => {
            let re = regex::Regex::new(fe.message.as_deref().unwrap_or("")).ok()?;
            (!re.is_match(&f.message)).then(|| {
                format!(
                    "  the message does not match\n  - expected {}: /{}/\n  + actual   {}: {:?}",
                    fe.kind,
                    fe.message.as_deref().unwrap_or(""),
                    f.kind,
                    f.message
                )
            })
        }
        _ => Some(format!(
            "  - expected: {}\n  + actual:   {}",
            describe_expect(expect),
            describe_got(got)
        )),
    }
}

fn describe_expect(e: &Expect) -> String {
    if let Some(emits) = &e.emits {
        format!("{} emit(s)", emits.len())
    } else if e.ok.is_some() {
        "success".into()
    } else if let Some(p) = &e.rejected {
        format!("rejected /{p}/")
    } else if let Some(r) = &e.retry {
        match r {
            RetryExpect::After { after_ms } => format!("retry after {after_ms} ms"),
            RetryExpect::Any(_) => "retry".into(),
        }
    } else if let Some(f) = &e.fails {
        format!("{} /{}/", f.kind, f.message.as_deref().unwrap_or(""))
    } else {
        "nothing".into()
    }
}

fn describe_got(got: &Result<Vec<Emit>, Failure>) -> String {
    match got {
        Ok(emits) => {
            let mut s = format!("{} emit(s)", emits.len());
            for e in emits {
                let _ = write!(s, "\n                {}", render_emit(e));
            }
            s
        }
        Err(f) => format!("{}: {}", f.kind, f.message),
    }
}

fn check_emits(want: &[ExpectedEmit], got: &[Emit]) -> Option<String> {
    let mut out = String::new();
    if want.len() != got.len() {
        let _ = writeln!(out, "  expected {} emit(s), got {}", want.len(), got.len());
    }
    for i in 0..want.len().max(got.len()) {
        match (want.get(i), got.get(i)) {
            (Some(w), Some(g)) => {
                let diffs = emit_diffs(w, g);
                if !diffs.is_empty() {
                    let _ = writeln!(out, "  emit {}: {}", i + 1, diffs.join("; "));
                    let _ = writeln!(
                        out,
                        "  - expected: {}",
                        serde_json::to_string(w).unwrap_or_default()
                    );
                    let _ = writeln!(out, "  + actual:   {}", render_emit(g));
                }
            }
            (Some(w), None) => {
                let _ = writeln!(
                    out,
                    "  - missing:  {}",
                    serde_json::to_string(w).unwrap_or_default()
                );
            }
            (None, Some(g)) => {
                let _ = writeln!(out, "  + extra:    {}", render_emit(g));
            }
            (None, None) => {}
        }
    }
    (!out.is_empty()).then(|| out.trim_end().to_owned())
}

/// The fields of `got` that differ from those `want` gives.
fn emit_diffs(want: &ExpectedEmit, got: &Emit) -> Vec<String> {
    let mut d = Vec::new();
    if let Some(t) = &want.topic
        && *t != got.topic
    {
        d.push(format!("topic {:?} != {:?}", got.topic, t));
    }
    if let Some(k) = &want.key
        && *k != got.key
    {
        d.push(format!("key {:?} != {:?}", got.key, k));
    }
    if let Some(h) = &want.headers
        && h.0 != got.headers
    {
        d.push("headers differ".into());
    }
    if let Some(p) = &want.payload
        && p.as_bytes() != got.payload.as_slice()
    {
        d.push("payload differs".into());
    }
    if let Some(b) = &want.payload_base64
        && decode_base64(b).ok().as_deref() != Some(got.payload.as_slice())
    {
        d.push("payload differs".into());
    }
    if let Some(j) = &want.payload_json {
        match serde_json::from_slice::<serde_json::Value>(&got.payload) {
            Ok(v) => {
                if let Some(at) = json_difference("$", j, &v) {
                    d.push(format!("payload JSON differs at {at}"));
                }
            }
            Err(e) => d.push(format!("payload is not JSON ({e})")),
        }
    }
    d
}

/// Where `got` first differs from `want` (a JSON path, `$.a[2]`), or
/// `None` when they are equal as values: numbers by value (`10` and `10.0`
/// are equal: JavaScript writes the one, Python the other), objects
/// whatever their key order.
fn json_difference(
    path: &str,
    want: &serde_json::Value,
    got: &serde_json::Value,
) -> Option<String> {
    use serde_json::Value as J;
    match (want, got) {
        (J::Number(a), J::Number(b)) => {
            let same = match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => a.as_f64() == b.as_f64(),
            };
            (!same).then(|| format!("{path}: got {b}, want {a}"))
        }
        (J::Array(a), J::Array(b)) => {
            if a.len() != b.len() {
                return Some(format!("{path}: got {} items, want {}", b.len(), a.len()));
            }
            a.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| json_difference(&format!("{path}[{i}]"), x, y))
        }
        (J::Object(a), J::Object(b)) => {
            if let Some(k) = a.keys().find(|k| !b.contains_key(*k)) {
                return Some(format!("{path}.{k}: missing"));
            }
            if let Some(k) = b.keys().find(|k| !a.contains_key(*k)) {
                return Some(format!("{path}.{k}: not expected"));
            }
            a.iter()
                .find_map(|(k, x)| json_difference(&format!("{path}.{k}"), x, &b[k]))
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!("{path}: got {b}, want {a}")),
    }
}

/// An emit as one JSON line, fields in the order a case writes them.
fn render_emit(e: &Emit) -> String {
    #[derive(Serialize)]
    struct Shown<'a> {
        topic: &'a str,
        key: Option<&'a str>,
        headers: Headers,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload_base64: Option<String>,
    }
    let text = std::str::from_utf8(&e.payload).ok();
    serde_json::to_string(&Shown {
        topic: &e.topic,
        key: e.key.as_deref(),
        headers: Headers(e.headers.clone()),
        payload: text,
        payload_base64: text
            .is_none()
            .then(|| base64::engine::general_purpose::STANDARD.encode(&e.payload)),
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn load_text(text: &str) -> Result<Loaded, String> {
        let dir = tempfile::tempdir().expect("test step");
        let path = dir.path().join("cases.yaml");
        std::fs::write(&path, text).expect("test step");
        load(&path).map_err(|e| e.replace(&path.display().to_string(), "F"))
    }

    fn emit(topic: &str, key: Option<&str>, payload: &str) -> Emit {
        Emit {
            topic: topic.into(),
            key: key.map(Into::into),
            headers: vec![("a".into(), "1".into())],
            payload: payload.as_bytes().to_vec(),
        }
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
    fn emits_compare_only_the_fields_given_and_explain_a_mismatch() {
        let want = vec![ExpectedEmit {
            payload: Some("HI".into()),
            key: Some(Some("k".into())),
            ..ExpectedEmit::default()
        }];
        assert_eq!(check_emits(&want, &[emit("out", Some("k"), "HI")]), None);
        let diff = check_emits(&want, &[emit("out", None, "Hi")]).expect("test step");
        assert!(diff.contains("key None != Some(\"k\")"), "{diff}");
        assert!(diff.contains("payload differs"), "{diff}");
        assert!(diff.contains("+ actual:   {"), "{diff}");
        let extra = check_emits(&[], &[emit("out", None, "x")]).expect("test step");
        assert!(
            extra.contains("expected 0 emit(s), got 1") && extra.contains("+ extra:"),
            "{extra}"
        );
        let json = ExpectedEmit {
            payload_json: Some(serde_json::json!({"a": 1, "b": [true]})),
            ..ExpectedEmit::default()
        };
        assert_eq!(
            emit_diffs(&json, &emit("o", None, r#"{ "b": [true], "a": 1 }"#)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn outcomes_of_the_wrong_kind_say_what_happened_instead() {
        let expect =
            |yaml: &str| -> Expect { crate::config::parse_yaml(yaml).expect("test step").0 };
        let rejected = Err(Failure::new(FailureKind::Rejected, "empty payload"));
        assert_eq!(check(&expect("rejected: empty"), &rejected), None);
        assert!(
            check(&expect("rejected: '^full'"), &rejected)
                .expect("test step")
                .contains("does not match")
        );
        let wrong = check(&expect("emits: []"), &rejected).expect("test step");
        assert!(
            wrong.contains("- expected: 0 emit(s)")
                && wrong.contains("+ actual:   rejected: empty payload"),
            "{wrong}"
        );
        let mut retry = Failure::new(FailureKind::Retry, "asked");
        retry.retry_after = Some(Duration::from_millis(5));
        assert_eq!(check(&expect("retry: { after_ms: 5 }"), &Err(retry)), None);
        assert_eq!(check(&expect("ok: true"), &Ok(vec![])), None);
        assert!(check(&expect("ok: true"), &rejected).is_some());
        let trap = Err(Failure::new(
            FailureKind::Trap,
            "Traceback...\nValueError: boom",
        ));
        assert_eq!(
            check(
                &expect("fails: { kind: trap, message: 'ValueError: boom' }"),
                &trap
            ),
            None
        );
    }

    #[test]
    fn json_payloads_compare_as_values_and_name_the_first_difference() {
        let want = serde_json::json!({"price": 10.0, "items": [1, {"n": 2}]});
        let same = serde_json::json!({"items": [1.0, {"n": 2}], "price": 10});
        assert_eq!(json_difference("$", &want, &same), None);
        let other = serde_json::json!({"items": [1, {"n": 3}], "price": 10});
        assert_eq!(
            json_difference("$", &want, &other).as_deref(),
            Some("$.items[1].n: got 3, want 2")
        );
        let more = serde_json::json!({"items": [1, {"n": 2}], "price": 10, "x": null});
        assert_eq!(
            json_difference("$", &want, &more).as_deref(),
            Some("$.x: not expected")
        );
        assert!(json_difference("$", &serde_json::json!(1), &serde_json::json!("1")).is_some());
        assert!(
            json_difference("$", &serde_json::json!(u64::MAX), &serde_json::json!(-1)).is_some()
        );
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

    #[test]
    fn control_characters_are_escaped_so_a_case_reads_back() {
        for text in ["a\u{7f}b", "c\u{85}d", "tab\there", "plain", "\u{9f}"] {
            let quoted = yaml_quoted(text);
            let back: String = crate::config::parse_yaml::<String>(&quoted)
                .unwrap_or_else(|e| panic!("{quoted}: {e:?}"))
                .0;
            assert_eq!(back, text, "{quoted}");
        }
    }
}
