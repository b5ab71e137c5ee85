//! Value parsers shared by subcommands, so every flag that takes a duration,
//! a size or a `K=V` pair accepts the same spellings and fails the same way.

use std::time::Duration;

/// `30s`, `250ms`, `1m 30s`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e}; expected a duration such as `500ms`, `30s` or `2m`"))
}

/// `67108864`, `64MiB`, `64 MB`, `1GiB`.
pub(crate) fn byte_size(text: &str) -> Result<usize, String> {
    let size: bytesize::ByteSize = text.parse().map_err(|e| {
        format!("{e}; expected a size such as `64MiB`, `512KiB` or a number of bytes")
    })?;
    usize::try_from(size.as_u64()).map_err(|_| format!("{text} is too large"))
}

/// `name=value`; the value may contain `=`.
pub(crate) fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not of the form NAME=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spellings_users_write() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(byte_size("64MiB"), Ok(64 << 20));
        assert_eq!(byte_size("1000"), Ok(1000));
        assert_eq!(key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(duration("fast").is_err());
        assert!(byte_size("lots").is_err());
        assert!(key_value("=x").is_err());
        assert!(key_value("novalue").is_err());
    }
}
