//! The secrets one stage's guest may read (`sluice:plugin/secrets`), and
//! the removal of their values from everything the guest says through the
//! host: its log lines, its stdout and stderr, and the reasons of its
//! failures, which reach dead letters.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The shortest prefix of a value that is redacted at the end of a text:
/// a line cut at the log's length limit may end in part of a secret.
const MIN_CUT_PREFIX: usize = 4;

/// The secrets a stage grants its guest, by name. Cheap to clone. Its
/// `Debug` shows names only.
#[derive(Clone, Default)]
pub struct GuestSecrets {
    stage: Arc<str>,
    values: Arc<BTreeMap<String, String>>,
    /// Secrets the guest may not read but whose values are redacted all
    /// the same: those the host puts into its HTTP headers, which a server
    /// might echo back.
    hidden: Arc<BTreeMap<String, String>>,
}

impl std::fmt::Debug for GuestSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestSecrets")
            .field("stage", &self.stage)
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl GuestSecrets {
    /// The secrets `values` (name to value) that stage `stage` lists.
    pub fn new(stage: &str, values: BTreeMap<String, String>) -> Self {
        GuestSecrets {
            stage: stage.into(),
            values: Arc::new(values),
            hidden: Arc::default(),
        }
    }

    /// The same secrets, for a stage named `stage` in errors (the daemon
    /// names it `pipeline/stage`).
    #[must_use]
    pub fn for_stage(mut self, stage: &str) -> Self {
        self.stage = stage.into();
        self
    }

    /// The stage, as errors name it.
    pub(crate) fn stage(&self) -> &str {
        &self.stage
    }

    /// These secrets (name to value) redacted too, not readable.
    #[must_use]
    pub fn also_redacting(mut self, hidden: BTreeMap<String, String>) -> Self {
        self.hidden = Arc::new(hidden);
        self
    }

    /// Whether the stage grants any secret.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value of `name`, or why the guest may not have it.
    pub(crate) fn get(&self, name: &str) -> Result<String, String> {
        match self.values.get(name) {
            Some(value) => Ok(value.clone()),
            None => {
                let listed: Vec<&str> = self.values.keys().map(String::as_str).collect();
                Err(format!(
                    "stage `{}` does not list the secret `{name}` under `secrets:` (it lists: {}); \
                     add it there, and define it in the pipeline's `secrets:` block",
                    self.stage,
                    if listed.is_empty() {
                        "none".to_owned()
                    } else {
                        listed.join(", ")
                    }
                ))
            }
        }
    }

    /// `text` with every granted value replaced by `[secret NAME]`, and a
    /// cut-off start of one at its very end by `[secret NAME, cut]`.
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        let all = || self.values.iter().chain(self.hidden.iter());
        for (name, value) in all() {
            if value.is_empty() {
                continue;
            }
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &format!("[secret {name}]")));
            }
        }
        for (name, value) in all() {
            // The longest proper prefix of the value the text ends with.
            let cut = (MIN_CUT_PREFIX..value.len())
                .rev()
                .filter(|n| value.is_char_boundary(*n))
                .find(|n| out.ends_with(&value[..*n]));
            if let Some(n) = cut {
                let keep = out.len() - n;
                out = Cow::Owned(format!("{}[secret {name}, cut]", &out[..keep]));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> GuestSecrets {
        GuestSecrets::new(
            "charge",
            BTreeMap::from([
                ("token".to_owned(), "tok-4242-abcd".to_owned()),
                ("empty".to_owned(), String::new()),
            ]),
        )
    }

    #[test]
    fn a_granted_value_is_read_and_an_ungranted_name_is_refused_with_the_fix() {
        let s = secrets();
        assert_eq!(s.get("token").as_deref(), Ok("tok-4242-abcd"));
        let err = s.get("other").expect_err("not granted");
        assert!(
            err.contains("stage `charge`")
                && err.contains("`other`")
                && err.contains("empty, token"),
            "{err}"
        );
        assert!(!format!("{s:?}").contains("4242"));
    }

    #[test]
    fn values_are_redacted_whole_and_cut_at_the_end() {
        let s = secrets();
        assert_eq!(
            s.redact("auth tok-4242-abcd twice tok-4242-abcd"),
            "auth [secret token] twice [secret token]"
        );
        assert_eq!(s.redact("cut off: tok-42"), "cut off: [secret token, cut]");
        // Shorter than MIN_CUT_PREFIX: an ordinary word stays.
        assert_eq!(s.redact("a tok"), "a tok");
        assert!(matches!(s.redact("nothing here"), Cow::Borrowed(_)));
    }
}
