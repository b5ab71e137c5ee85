//! A message's dedup key and payload hash.

use sha2::{Digest, Sha256};

use crate::config::DedupKey;

/// The dedup key of a message, or why it has none.
///
/// A JSON pointer's value is taken as is when it is a string, and as its
/// JSON text otherwise (`42`, `true`, `{"a":1}`); `null` counts as absent.
///
/// # Errors
///
/// The key is missing: the reason, for a dead-letter entry.
pub fn key_of(
    source: &DedupKey,
    id: &str,
    headers: &[(String, String)],
    payload: &[u8],
) -> Result<String, String> {
    let key = match source {
        DedupKey::Id => Some(id.to_owned()),
        DedupKey::Header(name) => headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone()),
        DedupKey::Json(pointer) => {
            let value: serde_json::Value = serde_json::from_slice(payload).map_err(|e| {
                format!("dedup key `json:{pointer}`: the payload is not JSON ({e})")
            })?;
            match value.pointer(pointer) {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(text)) => Some(text.clone()),
                Some(other) => Some(other.to_string()),
            }
        }
    };
    match key {
        Some(key) if !key.is_empty() => Ok(key),
        _ => Err(format!(
            "the message has no dedup key `{source}` (the stage's dedup.missing_key is `reject`)"
        )),
    }
}

/// SHA-256 of a dedup key: fixed-size, whatever the key, and made of
/// bytes any store can key by (hex for NATS KV).
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// SHA-256 of a payload.
pub fn payload_hash(payload: &[u8]) -> Vec<u8> {
    Sha256::digest(payload).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> Vec<(String, String)> {
        vec![("Order-Id".into(), "o-7".into())]
    }

    #[test]
    fn keys_come_from_the_id_a_header_or_a_json_pointer() {
        assert_eq!(key_of(&DedupKey::Id, "m1", &[], b""), Ok("m1".into()));
        assert_eq!(
            key_of(&DedupKey::Header("order-id".into()), "m1", &headers(), b""),
            Ok("o-7".into())
        );
        let payload = br#"{"order": {"id": "A1", "n": 42, "tags": [1]}, "none": null}"#;
        let json = |p: &str| key_of(&DedupKey::Json(p.into()), "m1", &[], payload);
        assert_eq!(json("/order/id"), Ok("A1".into()));
        assert_eq!(json("/order/n"), Ok("42".into()));
        assert_eq!(json("/order/tags"), Ok("[1]".into()));
        assert!(json("/none").is_err());
        assert!(json("/missing").is_err());
    }

    #[test]
    fn a_missing_key_says_which() {
        let why =
            key_of(&DedupKey::Header("x-id".into()), "m1", &headers(), b"").expect_err("missing");
        assert!(why.contains("header:x-id"), "{why}");
        let why =
            key_of(&DedupKey::Json("/a".into()), "m1", &[], b"not json").expect_err("not json");
        assert!(why.contains("not JSON"), "{why}");
    }

    #[test]
    fn hashes_differ_by_payload() {
        assert_eq!(payload_hash(b"a"), payload_hash(b"a"));
        assert_ne!(payload_hash(b"a"), payload_hash(b"b"));
        assert_eq!(payload_hash(b"a").len(), 32);
    }
}
