//! Names that connectors put into SQL and commands, checked as the
//! pipeline file is: never spliced unchecked.

/// A Postgres identifier as Sluice accepts one: `[a-z_][a-z0-9_]*`, at
/// most 63 bytes, optionally schema-qualified (`app.outbox`) when
/// `qualified` is allowed. Nothing that would need quoting, and no capital:
/// Postgres folds an unquoted `Orders` to `orders`, while Sluice quotes
/// what it splices, so `Orders` would silently name another table.
pub fn check_sql_identifier(text: &str, qualified: bool) -> Result<(), String> {
    let parts: Vec<&str> = text.split('.').collect();
    let ok = match parts.as_slice() {
        [one] => plain_sql(one),
        [schema, table] if qualified => plain_sql(schema) && plain_sql(table),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let lower = text.to_ascii_lowercase();
    if lower != text && check_sql_identifier(&lower, qualified).is_ok() {
        return Err(format!(
            "`{text}` has capital letters: Postgres folds an unquoted name to lowercase, so \
             the table your SQL calls `{text}` is `{lower}`; write `{lower}`"
        ));
    }
    Err(format!(
        "`{text}` is not a plain SQL identifier: use lowercase letters, digits and `_`, not \
         starting with a digit, at most 63 characters{}",
        if qualified {
            ", optionally qualified by a schema (`app.outbox`)"
        } else {
            ""
        }
    ))
}

fn plain_sql(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 63
        && part
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A stream, group or consumer name for Redis (and later a queue name):
/// `[A-Za-z0-9_.:-]+`, at most 200 bytes. No spaces, quotes or braces.
pub fn check_plain_name(text: &str) -> Result<(), String> {
    if !text.is_empty()
        && text.len() <= 200
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "`{text}` is not a plain name: use letters, digits, `_`, `.`, `:` and `-` \
             (at most 200 characters)"
        ))
    }
}
