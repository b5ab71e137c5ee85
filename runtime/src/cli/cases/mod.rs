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
//!
//! `format.rs` reads and checks the file, `from_dead_letter.rs` turns a
//! dead letter into a case, and `diff.rs` says how a call's result differs
//! from what its case expects.

mod diff;
mod format;
mod from_dead_letter;

pub(crate) use diff::{check, check_http, check_state};
#[cfg(feature = "fuzz")]
pub(crate) use format::parse;
pub(crate) use format::{Loaded, json_schema, load};
pub(crate) use from_dead_letter::{CaseState, dlq_case_refusal, dlq_case_yaml, dlq_failure};
