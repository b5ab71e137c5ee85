//! How a case's call differs from what the case expects: its outcome,
//! its emits field by field (JSON payloads as values), the state store
//! after it, and its HTTP exchanges. Each difference is printed as an
//! expected line beside an actual one.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use serde::Serialize;

use super::format::{Expect, ExpectedEmit, Headers, RetryExpect, decode_base64};
use crate::failure::{Failure, FailureKind};
use crate::plugin::Emit;

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

/// What a case's call did, against what it expected: None when it passed,
/// else the explanation (several lines).
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

    fn emit(topic: &str, key: Option<&str>, payload: &str) -> Emit {
        Emit {
            topic: topic.into(),
            key: key.map(Into::into),
            headers: vec![("a".into(), "1".into())],
            payload: payload.as_bytes().to_vec(),
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
}
