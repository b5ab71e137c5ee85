//! Names that connectors put into SQL and commands: checked here, never
//! spliced unchecked.

/// A Postgres identifier as Sluice accepts one: `[A-Za-z_][A-Za-z0-9_]*`,
/// at most 63 bytes, optionally schema-qualified (`app.outbox`) when
/// `qualified` is allowed. Nothing that would need quoting.
pub fn check_sql_identifier(text: &str, qualified: bool) -> Result<(), String> {
    let parts: Vec<&str> = text.split('.').collect();
    let ok = match parts.as_slice() {
        [one] => plain_sql(one),
        [schema, table] if qualified => plain_sql(schema) && plain_sql(table),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{text}` is not a plain SQL identifier: use letters, digits and `_`, not starting \
             with a digit, at most 63 characters{}",
            if qualified {
                ", optionally qualified by a schema (`app.outbox`)"
            } else {
                ""
            }
        ))
    }
}

fn plain_sql(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 63
        && part
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_identifiers() {
        assert!(check_sql_identifier("outbox", false).is_ok());
        assert!(check_sql_identifier("_t1", false).is_ok());
        assert!(check_sql_identifier("app.outbox", true).is_ok());
        for bad in [
            "app.outbox",
            "1t",
            "t-1",
            "t;drop table x",
            "\"t\"",
            "",
            "a.b.c",
        ] {
            assert!(check_sql_identifier(bad, false).is_err(), "{bad}");
        }
        assert!(check_sql_identifier(&"x".repeat(64), false).is_err());
    }

    #[test]
    fn plain_names() {
        assert!(check_plain_name("orders-in").is_ok());
        assert!(check_plain_name("app:orders.v1").is_ok());
        for bad in ["", "a b", "a\"b", "a{b}", "a\nb"] {
            assert!(check_plain_name(bad).is_err(), "{bad:?}");
        }
    }
}
