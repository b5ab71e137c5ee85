//! Environment interpolation in pipeline files.
//!
//! In any string value (not in keys):
//!
//! - `${NAME}` is the value of environment variable NAME; if NAME is unset
//!   that is an error, reported at the value that uses it;
//! - `${NAME:-default}` is NAME's value, or `default` when NAME is unset or
//!   empty (`default` is taken literally and cannot contain `}`);
//! - `$$` is a literal `$`; any other `$` is kept as it is.
//!
//! A variable inside a URL's user name or password (`redis://:${PW}@host`,
//! where the text around it says so) has its `@`, `/`, `?` and `#`
//! percent-encoded: a password holding them would otherwise move the host
//! (`p@ss/word` would send credentials to a host `ss`). `%` is left alone,
//! so a value already percent-encoded works as before.
//!
//! Interpolation runs **after** parsing, on the string scalars of the
//! positioned tree, so a value can never change the document's structure (a
//! variable holding `a: b` or a newline stays text) and the line and column of
//! every other error are those of the file as written. A value that came from
//! interpolation is still read as a number or boolean where the field wants
//! one, so `concurrency: ${WORKERS:-4}` works.

use std::borrow::Cow;

use super::tree::{Kind, Node, Pos};

/// Expands `text`, looking variables up with `env`.
///
/// # Errors
///
/// A message naming the variable when one is unset and has no default, or
/// saying what is wrong with a malformed `${...}`.
pub fn interpolate<'a>(
    text: &'a str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Cow<'a, str>, String> {
    if !text.contains('$') {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            // Errors say where in the value, never quote it: the value may
            // be a password that merely contains `${`.
            let column = text.len() - after.len();
            let Some(end) = body.find('}') else {
                return Err(format!(
                    "the `${{` at character {column} of this value has no closing `}}`; \
                     write `${{NAME}}` or `${{NAME:-default}}`, or `$$` for a literal `$`"
                ));
            };
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (expr, None),
            };
            if name.is_empty()
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                || name.starts_with(|c: char| c.is_ascii_digit())
            {
                return Err(format!(
                    "the `${{...}}` at character {column} of this value is not a valid \
                     variable reference; expected `${{NAME}}` or `${{NAME:-default}}` where \
                     NAME is letters, digits and `_`, or `$$` for a literal `$`"
                ));
            }
            let in_userinfo = in_url_userinfo(text, text.len() - after.len() - 1);
            let mut push = |value: &str| {
                if in_userinfo {
                    out.push_str(&encode_userinfo(value));
                } else {
                    out.push_str(value);
                }
            };
            match (env(name), default) {
                (Some(value), Some(default)) if value.is_empty() => push(default),
                (Some(value), _) => push(&value),
                (None, Some(default)) => push(default),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set; set it, or give a \
                         default with `${{{name}:-value}}`"
                    ));
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Cow::Owned(out))
}

/// Whether byte `at` of `template` lies in the user info of a URL the
/// template spells out: after `scheme://` and before an `@` that comes
/// before the authority ends (the first `/`, `?` or `#` after `://`).
/// References (`${...}`) are skipped over when looking for those, so a
/// variable's default cannot end the authority.
pub(crate) fn in_url_userinfo(template: &str, at: usize) -> bool {
    let Some(scheme_end) = template.find("://").map(|i| i + 3) else {
        return false;
    };
    if at < scheme_end {
        return false;
    }
    let bytes = template.as_bytes();
    let mut i = scheme_end;
    let mut last_at = None;
    while i < bytes.len() {
        match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                match template[i..].find('}') {
                    Some(end) => i += end + 1,
                    None => return false,
                }
                continue;
            }
            b'/' | b'?' | b'#' => break,
            b'@' => last_at = Some(i),
            _ => {}
        }
        i += 1;
    }
    last_at.is_some_and(|userinfo_end| at < userinfo_end)
}

/// `value` with the characters that would end a URL's user info (or move
/// its host) percent-encoded.
pub(crate) fn encode_userinfo(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '@' => out.push_str("%40"),
            '/' => out.push_str("%2F"),
            '?' => out.push_str("%3F"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Interpolates every string value in the tree, collecting one error per
/// scalar that fails.
pub(crate) fn interpolate_tree(
    node: &mut Node,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Vec<(Pos, String)>,
) {
    match &mut node.kind {
        Kind::Str(text) => match interpolate(text, env) {
            Ok(Cow::Borrowed(_)) => {}
            Ok(Cow::Owned(expanded)) => {
                node.written = Some(std::mem::replace(text, expanded));
            }
            Err(message) => errors.push((node.pos, message)),
        },
        Kind::Seq(items) => {
            for item in items {
                interpolate_tree(item, env, errors);
            }
        }
        Kind::Map(entries) => {
            for (_, value) in entries {
                interpolate_tree(value, env, errors);
            }
        }
        Kind::Null | Kind::Bool(_) | Kind::Int(_) | Kind::UInt(_) | Kind::Float(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("db.local".into()),
            "EMPTY" => Some(String::new()),
            "TRICKY" => Some("a: b\n- c".into()),
            "PW" => Some("p@ss/w?rd#1:x%41".into()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<String, String> {
        interpolate(text, &env).map(Cow::into_owned)
    }

    #[test]
    fn expands_variables_and_defaults() {
        assert_eq!(
            run("nats://${HOST}:4222"),
            Ok("nats://db.local:4222".into())
        );
        assert_eq!(run("${MISSING:-fallback}"), Ok("fallback".into()));
        assert_eq!(run("${HOST:-fallback}"), Ok("db.local".into()));
        assert_eq!(run("${EMPTY:-fallback}"), Ok("fallback".into()));
        assert_eq!(run("${EMPTY}"), Ok(String::new()));
        assert_eq!(run("${MISSING:-}"), Ok(String::new()));
        assert_eq!(run("${TRICKY}"), Ok("a: b\n- c".into()));
        assert_eq!(run("${HOST}${HOST}"), Ok("db.localdb.local".into()));
    }

    #[test]
    fn a_password_in_a_url_cannot_move_its_host() {
        assert_eq!(
            run("https://hook:${PW}@hooks.example/in"),
            Ok("https://hook:p%40ss%2Fw%3Frd%231:x%41@hooks.example/in".into())
        );
        assert_eq!(
            run("redis://:${PW}@${HOST}:6379/0"),
            Ok("redis://:p%40ss%2Fw%3Frd%231:x%41@db.local:6379/0".into())
        );
        // Not in user info: the host, the path, a whole URL, no URL.
        assert_eq!(
            run("https://${HOST}/x/${HOST}"),
            Ok("https://db.local/x/db.local".into())
        );
        assert_eq!(
            run("https://h/${PW}@x"),
            Ok("https://h/p@ss/w?rd#1:x%41@x".into())
        );
        assert_eq!(run("${PW}"), Ok("p@ss/w?rd#1:x%41".into()));
        assert_eq!(run("${MISSING:-a/b}@x"), Ok("a/b@x".into()));
    }

    #[test]
    fn dollars_escape_and_stray_dollars_stay() {
        assert_eq!(run("pa$$word"), Ok("pa$word".into()));
        assert_eq!(run("$${HOST}"), Ok("${HOST}".into()));
        assert_eq!(run("costs $5"), Ok("costs $5".into()));
        assert_eq!(run("end$"), Ok("end$".into()));
        assert!(matches!(
            interpolate("plain", &env),
            Ok(Cow::Borrowed("plain"))
        ));
    }

    #[test]
    fn unset_and_malformed_references_are_errors() {
        let err = run("${MISSING}").expect_err("an error");
        assert!(err.contains("`MISSING` is not set"), "{err}");
        assert!(err.contains("${MISSING:-value}"), "{err}");
        assert!(run("${HOST").expect_err("an error").contains("closing"));
        // A password that happens to hold `${` is never quoted back.
        for secret in ["hunter2${", "hunter2${x y}", "s3cr${}et"] {
            let err = run(secret).expect_err("an error");
            assert!(!err.contains("hunter2") && !err.contains("s3cr"), "{err}");
            assert!(err.contains("character"), "{err}");
        }
        assert!(
            run("${}")
                .expect_err("an error")
                .contains("not a valid variable")
        );
        assert!(
            run("${A B}")
                .expect_err("an error")
                .contains("not a valid variable")
        );
        assert!(
            run("${1X}")
                .expect_err("an error")
                .contains("not a valid variable")
        );
    }
}
