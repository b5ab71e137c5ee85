//! A dead letter as a case: the message as its handler saw it, for a
//! replay (`plugin test --from-dlq`) or as YAML to append to a cases file
//! (`dlq show --as-case`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::format::{Case, CasesFile, Expect, Headers, Input, Loaded};
use crate::admin::DlqEntryDetail;
use crate::config::Pos;

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

/// A dead letter as one case, in YAML: a list item to append under a cases
/// file's `cases:`, expecting success (`ok: true`) until the author says
/// what the fixed handler must emit.
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

#[cfg(test)]
mod tests {
    use super::*;

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
