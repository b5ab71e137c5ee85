//! What arrived in one place (a sink's receiver, a DLQ), counted per input
//! so the end of the soak can tell lost from duplicated from unexpected.

use super::{Class, class, index_of, message_id, payload};

/// How many examples of a problem a tally keeps for the report.
const EXAMPLES: usize = 5;

/// How one place's contents compare with what the inputs call for.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub place: &'static str,
    /// Messages that arrived (or are stored).
    pub stored: u64,
    pub expected: u64,
    /// Expected inputs with no message.
    pub lost: u64,
    /// Extra copies: an input's messages past its first.
    pub duplicated: u64,
    /// Messages of inputs that must not be here, or of no input at all.
    pub unexpected: u64,
    /// Messages of an input whose payload differs from the input's.
    pub altered: u64,
    /// DLQ entries that are not a rejection on the first attempt.
    pub wrong_kind: u64,
    /// Some lost or unexpected inputs, for the report.
    pub examples: Vec<String>,
}

impl Tally {
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.unexpected == 0
            && self.altered == 0
            && self.wrong_kind == 0
    }

    pub fn is_dlq(&self) -> bool {
        self.place.ends_with(".dlq")
    }

    fn example(&mut self, what: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(what);
        }
    }
}

/// Counts what arrives in one place, per input.
pub(super) struct Ledger {
    tally: Tally,
    /// Whether input `i` must arrive here exactly once (else never).
    expect: fn(u64) -> bool,
    /// DLQ entries must be rejections on the first attempt.
    dlq: bool,
    /// Arrivals per input index; grows with the highest index seen.
    seen: Vec<u32>,
    /// First arrivals of inputs to be retried that show a second attempt at
    /// `stamp`, and of other inputs that show more than one.
    pub retried: u64,
    pub redelivered: u64,
}

impl Ledger {
    pub fn new(place: &'static str, expect: fn(u64) -> bool, dlq: bool) -> Ledger {
        Ledger {
            tally: Tally {
                place,
                ..Tally::default()
            },
            expect,
            dlq,
            seen: Vec::new(),
            retried: 0,
            redelivered: 0,
        }
    }

    /// One message arrived, with `payload` and headers looked up by
    /// `header`.
    pub fn record<'h>(&mut self, text: &str, header: impl Fn(&str) -> Option<&'h str>) {
        self.tally.stored += 1;
        let Some(i) = index_of(text) else {
            self.tally.unexpected += 1;
            let shown: String = text.chars().take(120).collect();
            self.tally.example(format!("not an input: {shown:?}"));
            return;
        };
        let Ok(slot) = usize::try_from(i) else {
            self.tally.unexpected += 1;
            return;
        };
        if slot >= self.seen.len() {
            self.seen.resize(slot + 1, 0);
        }
        self.seen[slot] += 1;
        let count = self.seen[slot];
        if !(self.expect)(i) {
            self.tally.unexpected += 1;
            self.tally.example(format!("unexpected {}", message_id(i)));
        } else if count > 1 {
            self.tally.duplicated += 1;
            self.tally.example(format!("duplicated {}", message_id(i)));
        }
        if text != payload(i) {
            self.tally.altered += 1;
        }
        if self.dlq
            && (header("sluice-dlq-kind") != Some("rejected")
                || header("sluice-dlq-attempts") != Some("1"))
        {
            self.tally.wrong_kind += 1;
        }
        if count == 1 {
            let attempt: u32 = header("x-attempt")
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            match class(i) {
                Class::Retry if attempt >= 2 => self.retried += 1,
                Class::Retry => {}
                _ if attempt > 1 => self.redelivered += 1,
                _ => {}
            }
        }
    }

    /// The tally once inputs `0..inputs` were all sent: the expected ones
    /// that never arrived are lost, and arrivals of higher indexes are
    /// unexpected.
    pub fn finish(&mut self, inputs: u64) -> Tally {
        let place = self.tally.place;
        let mut tally = std::mem::replace(
            &mut self.tally,
            Tally {
                place,
                ..Tally::default()
            },
        );
        tally.expected = (0..inputs).filter(|&i| (self.expect)(i)).count() as u64;
        for i in 0..inputs {
            let count = usize::try_from(i)
                .ok()
                .and_then(|s| self.seen.get(s).copied())
                .unwrap_or(0);
            if (self.expect)(i) && count == 0 {
                tally.lost += 1;
                tally.example(format!("lost {}", message_id(i)));
            }
        }
        let beyond: u64 = self
            .seen
            .iter()
            .skip(usize::try_from(inputs).unwrap_or(usize::MAX))
            .map(|&c| u64::from(c))
            .sum();
        if beyond > 0 {
            tally.unexpected += beyond;
            tally.example(format!("{beyond} messages of inputs never sent"));
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<&'static str> {
        None
    }

    #[test]
    fn lost_duplicated_unexpected_and_altered_are_told_apart() {
        let mut ledger = Ledger::new("out.x", |i| i != 3, false);
        for i in [0, 1, 1, 3, 4] {
            ledger.record(&payload(i), none);
        }
        ledger.record(r#"{"id":"soak-000000002","pad":"changed"}"#, none);
        ledger.record("not json", none);
        ledger.record(&payload(9), none);
        let tally = ledger.finish(5);
        assert_eq!(tally.stored, 8);
        assert_eq!(tally.expected, 4);
        assert_eq!(tally.lost, 0, "{:?}", tally.examples);
        assert_eq!(tally.duplicated, 1);
        // Input 3 (not expected), the non-input and input 9 (never sent).
        assert_eq!(tally.unexpected, 3);
        assert_eq!(tally.altered, 1);
        assert!(!tally.ok());

        let mut ledger = Ledger::new("out.x", |_| true, false);
        ledger.record(&payload(1), none);
        let tally = ledger.finish(3);
        assert_eq!((tally.lost, tally.unexpected), (2, 0));
        assert_eq!(tally.place, "out.x");
    }

    #[test]
    fn a_dlq_entry_must_be_a_first_attempt_rejection() {
        let mut ledger = Ledger::new("x.dlq", |_| true, true);
        ledger.record(&payload(0), |h| match h {
            "sluice-dlq-kind" => Some("rejected"),
            "sluice-dlq-attempts" => Some("1"),
            _ => None,
        });
        ledger.record(&payload(1), |h| match h {
            "sluice-dlq-kind" => Some("exhausted"),
            "sluice-dlq-attempts" => Some("5"),
            _ => None,
        });
        let tally = ledger.finish(2);
        assert_eq!(tally.wrong_kind, 1);
        assert!(tally.is_dlq());
    }

    #[test]
    fn attempts_count_on_the_first_arrival() {
        let mut ledger = Ledger::new("out.c", |_| true, false);
        let retry = (0..200)
            .find(|&i| class(i) == Class::Retry)
            .expect("a retry");
        ledger.record(&payload(retry), |h| (h == "x-attempt").then_some("2"));
        ledger.record(&payload(0), |h| (h == "x-attempt").then_some("3"));
        ledger.record(&payload(0), |h| (h == "x-attempt").then_some("4"));
        assert_eq!((ledger.retried, ledger.redelivered), (1, 1));
    }
}
