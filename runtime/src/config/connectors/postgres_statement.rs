//! A Postgres sink's own statement (`statement:`), its named parameters
//! (`$id`, `$payload_json`, `$header_x`, ...) rewritten to `$1..$n`:
//! `validate` refuses one that does not rewrite, and the table sink runs
//! the rewritten one.

/// A named parameter of a user statement: where its value comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Param {
    /// `$id`: the message id (text).
    Id,
    /// `$topic`: the topic it was published to (text).
    Topic,
    /// `$key`: its key (text or NULL).
    Key,
    /// `$payload`: the body (bytea).
    Payload,
    /// `$payload_text`: the body as UTF-8 text; a body that is not is
    /// rejected.
    PayloadText,
    /// `$payload_json`: the body as JSON (jsonb), parsed by the server; a
    /// body that is not JSON is rejected with the server's message.
    PayloadJson,
    /// `$published_at`: when it was published (timestamptz).
    PublishedAt,
    /// `$header_<name>`: the first value of header `<name>` (or, if there
    /// is none, of `<name>` with `_` read as `-`), text or NULL.
    Header(String),
}

impl Param {
    pub(crate) fn parse(name: &str) -> Option<Param> {
        Some(match name {
            "id" => Param::Id,
            "topic" => Param::Topic,
            "key" => Param::Key,
            "payload" => Param::Payload,
            "payload_text" => Param::PayloadText,
            "payload_json" => Param::PayloadJson,
            "published_at" => Param::PublishedAt,
            other => Param::Header(other.strip_prefix("header_")?.to_owned()).non_empty()?,
        })
    }

    fn non_empty(self) -> Option<Param> {
        match &self {
            Param::Header(name) if name.is_empty() => None,
            _ => Some(self),
        }
    }
}

/// A user statement with its named parameters made positional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The SQL with `$1..$n`.
    pub sql: String,
    /// What `$1..$n` are, in order (a name used twice is one parameter).
    pub params: Vec<Param>,
}

/// Why a statement cannot be rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// A `$name` that is not a parameter Sluice provides.
    #[error(
        "unknown parameter `${0}`; use $id, $topic, $key, $payload, $payload_text, $payload_json, $published_at or $header_<name>"
    )]
    Unknown(String),
    /// A positional `$1`: the statement names its parameters.
    #[error("positional parameter `${0}`: name the parameter instead ($id, $payload, ...)")]
    Positional(String),
    /// A string, quoted identifier, comment or dollar quote never closed.
    #[error("the statement ends inside {0}")]
    Unterminated(&'static str),
}

/// Rewrites `$name` parameters of `sql` to `$1..$n`. String literals
/// (`'...'`, `E'...'`), quoted identifiers, `--` and `/* */` comments and
/// dollar quotes (`$$...$$`, `$tag$...$tag$`) are copied untouched; a `$`
/// inside an identifier (`a$b`) is not a parameter.
pub fn rewrite_statement(sql: &str) -> Result<Rewritten, RewriteError> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut params: Vec<Param> = Vec::new();
    let mut i = 0;
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80;
    let find = |from: usize, needle: &str| sql[from..].find(needle).map(|at| from + at);
    // `copied` marks how far `sql` has been copied to `out`.
    let mut copied = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => {
                let escapes =
                    i > 0 && matches!(bytes[i - 1], b'e' | b'E') && (i < 2 || !ident(bytes[i - 2]));
                let mut j = i + 1;
                loop {
                    match bytes.get(j) {
                        None => return Err(RewriteError::Unterminated("a string literal")),
                        Some(b'\\') if escapes => j += 2,
                        Some(b'\'') if bytes.get(j + 1) == Some(&b'\'') => j += 2,
                        Some(b'\'') => break,
                        Some(_) => j += 1,
                    }
                }
                i = j + 1;
            }
            b'"' => {
                let mut j = i + 1;
                loop {
                    match bytes.get(j) {
                        None => return Err(RewriteError::Unterminated("a quoted identifier")),
                        Some(b'"') if bytes.get(j + 1) == Some(&b'"') => j += 2,
                        Some(b'"') => break,
                        Some(_) => j += 1,
                    }
                }
                i = j + 1;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = find(i, "\n").map_or(bytes.len(), |at| at + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let mut depth = 0usize;
                let mut j = i;
                loop {
                    if j + 1 >= bytes.len() {
                        return Err(RewriteError::Unterminated("a /* comment */"));
                    }
                    if bytes[j] == b'/' && bytes[j + 1] == b'*' {
                        depth += 1;
                        j += 2;
                    } else if bytes[j] == b'*' && bytes[j + 1] == b'/' {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                i = j;
            }
            b'$' if i > 0 && ident(bytes[i - 1]) => i += 1,
            b'$' => {
                let start = i + 1;
                let mut end = start;
                while end < bytes.len() && ident(bytes[end]) {
                    end += 1;
                }
                let name = &sql[start..end];
                if name.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(RewriteError::Positional(name.to_owned()));
                }
                if bytes.get(end) == Some(&b'$') {
                    // A dollar quote: `$tag$ ... $tag$`.
                    let tag = &sql[i..=end];
                    match find(end + 1, tag) {
                        Some(close) => i = close + tag.len(),
                        None => return Err(RewriteError::Unterminated("a dollar-quoted string")),
                    }
                } else if name.is_empty() {
                    i += 1;
                } else {
                    let param =
                        Param::parse(name).ok_or_else(|| RewriteError::Unknown(name.to_owned()))?;
                    let index = match params.iter().position(|p| *p == param) {
                        Some(at) => at + 1,
                        None => {
                            params.push(param);
                            params.len()
                        }
                    };
                    out.push_str(&sql[copied..i]);
                    out.push('$');
                    out.push_str(&index.to_string());
                    copied = end;
                    i = end;
                }
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Ok(Rewritten { sql: out, params })
}
