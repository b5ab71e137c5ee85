//! A pipeline's `secrets:` block and the `{secret:name}` references to it.
//!
//! ```yaml
//! secrets:
//!   api_token: { env: PAYMENTS_TOKEN }            # exactly one of env or file
//!   signing_key: { file: /run/secrets/signing }   # a mounted secret
//! sources:
//!   - name: orders
//!     kafka: { ..., sasl: { username: app, password: "{secret:api_token}" } }
//! ```
//!
//! A secret is named once, by reference, and read when the file is loaded
//! (so again on every reload: a rotated file is picked up). Its value goes
//! only where a field is secret by type ([`Secret`], [`SecretUrl`]: the
//! password and token fields of the connector blocks), which show `***`
//! wherever they are printed. A reference anywhere else stays text, so a
//! secret cannot leak through a topic name or a `config:` value.
//!
//! References are resolved while the connector blocks are deserialized:
//! [`with_values`] makes a file's secrets visible to [`resolve`] for the
//! length of that one call, so an undefined name is an error at the field
//! that names it, with its line and column.
//!
//! [`Secret`]: crate::config::Secret
//! [`SecretUrl`]: crate::config::SecretUrl

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tree::{Kind, Node, Pos};

/// Where one secret's value comes from: exactly one of `env` or `file`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// An environment variable of the daemon's (its value, as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// A file (a mounted Kubernetes or Docker secret), relative to the
    /// pipeline file's directory; one trailing newline is dropped. Read
    /// again on reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

/// The largest secret file read: a key or a token, not a document.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

/// A file's secrets, by name, with their values: never printed
/// (`Debug` shows the names only).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(BTreeMap<String, String>);

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl SecretValues {
    /// The value of secret `name`, for the code that uses it.
    pub fn expose(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Every value, for redacting text that may hold one.
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.0.values().map(String::as_str)
    }

    /// Whether secret `name` is defined.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// Reads the `secrets:` block of `tree` (a whole pipeline file): each
/// secret's source checked and its value read. Files are relative to `dir`.
/// Problems are reported at the secret they concern and never quote a
/// value.
pub(crate) fn read_block(
    tree: &Node,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SecretValues, Vec<(Pos, String)>> {
    let mut values = BTreeMap::new();
    let mut problems = Vec::new();
    let Kind::Map(entries) = &tree.kind else {
        return Ok(SecretValues::default());
    };
    let Some((_, block)) = entries.iter().find(|(k, _)| k.name == "secrets") else {
        return Ok(SecretValues::default());
    };
    let Kind::Map(secrets) = &block.kind else {
        // The typed model reports the wrong type at its position.
        return Ok(SecretValues::default());
    };
    for (key, node) in secrets {
        let name = key.name.as_str();
        if let Err(why) = check_name(name) {
            problems.push((key.pos, why));
            continue;
        }
        let Ok(source) = SecretSource::deserialize(node) else {
            // The typed model reports it, at the field.
            continue;
        };
        match read_one(name, &source, dir, env) {
            Ok(value) => {
                values.insert(name.to_owned(), value);
            }
            Err(why) => problems.push((node.pos, why)),
        }
    }
    if problems.is_empty() {
        Ok(SecretValues(values))
    } else {
        Err(problems)
    }
}

/// Reads one secret given as `env:VAR` or `file:PATH` (a path relative to
/// the current directory), as `sluice plugin test --secret NAME=...` takes
/// it: checked and read as a pipeline's `secrets:` block would be. Errors
/// never quote the value.
pub fn read_spec(name: &str, spec: &str) -> Result<String, String> {
    check_name(name)?;
    let source = match spec.split_once(':') {
        Some(("env", var)) => SecretSource {
            env: Some(var.to_owned()),
            file: None,
        },
        Some(("file", path)) => SecretSource {
            env: None,
            file: Some(PathBuf::from(path)),
        },
        _ => {
            return Err(format!(
                "secret `{name}`: give its source as `env:VAR` or `file:PATH`, never the \
                 value itself (a command line is seen by `ps` and kept in shell history)"
            ));
        }
    };
    read_one(name, &source, Path::new("."), &|var| {
        std::env::var(var).ok()
    })
}

/// A secret's name: lowercase letters, digits and `_`, as `{secret:name}`
/// writes it.
fn check_name(name: &str) -> Result<(), String> {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
    {
        Ok(())
    } else {
        Err(format!(
            "secret name `{name}` is not valid; use lowercase letters, digits and `_`, \
             starting with a letter (`api_token`)"
        ))
    }
}

fn read_one(
    name: &str,
    source: &SecretSource,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    match (&source.env, &source.file) {
        (Some(_), Some(_)) => Err(format!(
            "secret `{name}` has both `env` and `file`; give exactly one"
        )),
        (None, None) => Err(format!(
            "secret `{name}` has neither `env` nor `file`; give exactly one \
             (`{{env: VAR}}` or `{{file: /run/secrets/{name}}}`)"
        )),
        (Some(var), None) => match env(var) {
            Some(value) if !value.is_empty() => Ok(value),
            Some(_) => Err(format!(
                "secret `{name}`: environment variable `{var}` is empty"
            )),
            None => Err(format!(
                "secret `{name}`: environment variable `{var}` is not set"
            )),
        },
        (None, Some(file)) => {
            let path = dir.join(file);
            let read = std::fs::File::open(&path).and_then(|f| {
                let mut bytes = Vec::new();
                f.take(MAX_SECRET_BYTES + 1).read_to_end(&mut bytes)?;
                Ok(bytes)
            });
            let bytes =
                read.map_err(|e| format!("secret `{name}`: cannot read {}: {e}", path.display()))?;
            if bytes.len() as u64 > MAX_SECRET_BYTES {
                return Err(format!(
                    "secret `{name}`: {} is larger than {} KiB; a secret file holds one \
                     key or token",
                    path.display(),
                    MAX_SECRET_BYTES >> 10
                ));
            }
            let mut value = String::from_utf8(bytes)
                .map_err(|_| format!("secret `{name}`: {} is not UTF-8 text", path.display()))?;
            if value.ends_with('\n') {
                value.pop();
                if value.ends_with('\r') {
                    value.pop();
                }
            }
            if value.is_empty() {
                return Err(format!("secret `{name}`: {} is empty", path.display()));
            }
            Ok(value)
        }
    }
}

thread_local! {
    /// The secrets of the file being deserialized, while [`with_values`]
    /// runs.
    static VALUES: RefCell<Option<SecretValues>> = const { RefCell::new(None) };
}

/// Runs `f` (the deserialization of one pipeline file) with `values` as the
/// secrets [`resolve`] sees.
pub(crate) fn with_values<T>(values: SecretValues, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            VALUES.with(|v| v.borrow_mut().take());
        }
    }
    VALUES.with(|v| *v.borrow_mut() = Some(values));
    let _reset = Reset;
    f()
}

/// The opening of a reference.
pub(crate) const OPEN: &str = "{secret:";

/// The names `text` references as `{secret:name}`.
pub fn referenced(text: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        let body = &rest[at + OPEN.len()..];
        let Some(end) = body.find('}') else { break };
        names.push(&body[..end]);
        rest = &body[end + 1..];
    }
    names
}

/// `text` with every `{secret:name}` replaced by the secret's value, and
/// the values put in (for a field that must mask them wherever they land).
/// Text without a reference comes back as it is.
///
/// # Errors
///
/// A reference to a secret the file does not define, or a malformed one;
/// the message names the secret, never a value.
pub fn resolve(text: &str) -> Result<(String, Vec<String>), String> {
    resolve_with(text, &|_, value| value.to_owned())
}

/// [`resolve`] for a URL: a secret in its user name or password has its
/// `@`, `/`, `?` and `#` percent-encoded, as `${VAR}` has there.
///
/// # Errors
///
/// As [`resolve`].
pub fn resolve_url(text: &str) -> Result<(String, Vec<String>), String> {
    resolve_with(text, &|at, value| {
        if super::interpolate::in_url_userinfo(text, at) {
            super::interpolate::encode_userinfo(value)
        } else {
            value.to_owned()
        }
    })
}

/// [`resolve`], putting in `encode(byte offset of the reference in
/// text, value)` for each reference.
fn resolve_with(
    text: &str,
    encode: &dyn Fn(usize, &str) -> String,
) -> Result<(String, Vec<String>), String> {
    if !text.contains(OPEN) {
        return Ok((text.to_owned(), Vec::new()));
    }
    VALUES.with(|values| {
        let values = values.borrow();
        let mut out = String::with_capacity(text.len());
        let mut used = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(OPEN) {
            out.push_str(&rest[..at]);
            let body = &rest[at + OPEN.len()..];
            let Some(end) = body.find('}') else {
                return Err("a `{secret:` reference has no closing `}`; write \
                            `{secret:name}` for a secret of the `secrets:` block"
                    .to_owned());
            };
            let name = &body[..end];
            let value = values
                .as_ref()
                .and_then(|v| v.expose(name))
                .ok_or_else(|| {
                    if check_name(name).is_err() {
                        "`{secret:...}` names no valid secret; write `{secret:name}` with the \
                         name of a secret of the pipeline's `secrets:` block"
                            .to_owned()
                    } else {
                        format!(
                            "secret `{name}` is not defined; add it to the pipeline's `secrets:` \
                         block (`{name}: {{env: VAR}}` or `{{file: PATH}}`)"
                        )
                    }
                })?;
            let put = encode(text.len() - rest.len() + at, value);
            if put != value {
                used.push(put.clone());
            }
            out.push_str(&put);
            used.push(value.to_owned());
            rest = &body[end + 1..];
        }
        out.push_str(rest);
        Ok((out, used))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> SecretValues {
        SecretValues(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn references_resolve_only_inside_with_values() {
        assert_eq!(resolve("plain"), Ok(("plain".into(), vec![])));
        assert!(resolve("{secret:pw}").is_err(), "no secrets outside a load");
        let got = with_values(values(&[("pw", "s3cr3t")]), || {
            resolve("redis://:{secret:pw}@h:6379/0")
        });
        assert_eq!(
            got,
            Ok(("redis://:s3cr3t@h:6379/0".into(), vec!["s3cr3t".into()]))
        );
        assert!(resolve("{secret:pw}").is_err(), "reset after the load");
    }

    #[test]
    fn a_secret_in_a_url_password_is_encoded() {
        let got = with_values(values(&[("pw", "p@ss/w")]), || {
            resolve_url("redis://:{secret:pw}@h:6379/{secret:pw}")
        });
        let (url, used) = got.expect("resolves");
        assert_eq!(url, "redis://:p%40ss%2Fw@h:6379/p@ss/w");
        assert!(used.contains(&"p@ss/w".to_owned()) && used.contains(&"p%40ss%2Fw".to_owned()));
    }

    #[test]
    fn bad_references_name_the_secret_and_never_a_value() {
        with_values(values(&[("pw", "s3cr3t")]), || {
            let err = resolve("{secret:other}").expect_err("undefined");
            assert!(err.contains("`other` is not defined"), "{err}");
            let err = resolve("x{secret:pw").expect_err("unclosed");
            assert!(err.contains("closing"), "{err}");
            let err = resolve("{secret:Bad Name}").expect_err("invalid");
            assert!(err.contains("no valid secret"), "{err}");
            assert!(!err.contains("s3cr3t"));
        });
    }

    #[test]
    fn a_source_is_exactly_one_of_env_or_file() {
        let dir = tempfile::tempdir().expect("dir");
        let env = |name: &str| match name {
            "SET" => Some("v1".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let read = |env_var: Option<&str>, file: Option<&str>| {
            read_one(
                "k",
                &SecretSource {
                    env: env_var.map(str::to_owned),
                    file: file.map(PathBuf::from),
                },
                dir.path(),
                &env,
            )
        };
        assert_eq!(read(Some("SET"), None), Ok("v1".into()));
        assert!(
            read(Some("SET"), Some("f"))
                .expect_err("both")
                .contains("both")
        );
        assert!(read(None, None).expect_err("neither").contains("neither"));
        assert!(
            read(Some("UNSET"), None)
                .expect_err("unset")
                .contains("not set")
        );
        assert!(
            read(Some("EMPTY"), None)
                .expect_err("empty")
                .contains("empty")
        );
        std::fs::write(dir.path().join("f"), "tok\n").expect("write");
        assert_eq!(read(None, Some("f")), Ok("tok".into()));
        std::fs::write(dir.path().join("crlf"), "tok\r\n").expect("write");
        assert_eq!(read(None, Some("crlf")), Ok("tok".into()));
        assert!(
            read(None, Some("missing"))
                .expect_err("missing")
                .contains("cannot read")
        );
        std::fs::write(dir.path().join("big"), vec![b'x'; 70 << 10]).expect("write");
        assert!(read(None, Some("big")).expect_err("big").contains("larger"));
    }

    #[test]
    fn debug_shows_names_not_values() {
        let shown = format!("{:?}", values(&[("pw", "s3cr3t")]));
        assert!(shown.contains("pw") && !shown.contains("s3cr3t"), "{shown}");
    }
}
