//! Deterministic ids for a handler's outputs.
//!
//! An output's id is a hash of the input's id, the stage and the output's
//! index. Handling the same input again (after a crash, a lost lease or a
//! broker hiccup) yields the same ids, so the broker's duplicate window or
//! transaction turns the republish into a no-op instead of a duplicate.

use sha2::{Digest, Sha256};

/// The id of output number `index` of `input_id` at `pipeline`/`stage`:
/// 32 hex digits (128 bits of SHA-256).
pub fn emit_id(pipeline: &str, stage: &str, input_id: &str, index: usize) -> String {
    let mut hasher = Sha256::new();
    for part in [pipeline.as_bytes(), stage.as_bytes(), input_id.as_bytes()] {
        // Length-prefixed, so ("a", "bc") and ("ab", "c") differ.
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update((index as u64).to_be_bytes());
    let digest = hasher.finalize();
    let mut out = String::with_capacity(32);
    for byte in &digest[..16] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_distinct() {
        let a = emit_id("p", "s", "m1", 0);
        assert_eq!(a, emit_id("p", "s", "m1", 0));
        assert_eq!(a.len(), 32);
        assert_ne!(a, emit_id("p", "s", "m1", 1));
        assert_ne!(a, emit_id("p", "t", "m1", 0));
        assert_ne!(emit_id("p", "ab", "c", 0), emit_id("p", "a", "bc", 0));
    }
}
