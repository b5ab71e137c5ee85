//! Reading the stage's `config:` map, the only way a handler is configured.

use std::fmt::Display;
use std::str::FromStr;

use crate::HandlerError;
use crate::bindings::handler::sluice::plugin::host;

/// Returns the value of `key` in the stage's `config:` map (or
/// `sluice plugin test --config`), or `None` when it is absent.
pub fn config(key: &str) -> Option<String> {
    host::config_get(key)
}

/// Returns the value of `key`, or `default` when it is absent, for settings
/// that have a sensible default.
pub fn config_or(key: &str, default: &str) -> String {
    config(key).unwrap_or_else(|| default.to_owned())
}

/// Parses the value of `key` with [`FromStr`]: `Ok(None)` when absent, and a
/// `reject` naming the key and the value when it does not parse, since a
/// misconfigured stage cannot handle the message.
///
/// ```ignore
/// let limit: u32 = sluice_sdk::config_parse("limit")?.unwrap_or(10);
/// ```
pub fn config_parse<T>(key: &str) -> Result<Option<T>, HandlerError>
where
    T: FromStr,
    T::Err: Display,
{
    config(key).map(|raw| parse(key, &raw)).transpose()
}

/// Parses one config value, trimmed; a `reject` naming the key and the
/// value when it does not parse.
fn parse<T>(key: &str, raw: &str) -> Result<T, HandlerError>
where
    T: FromStr,
    T::Err: Display,
{
    raw.trim()
        .parse()
        .map_err(|e| HandlerError::reject(format_args!("config `{key}` = {raw:?} is invalid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_trimmed_and_a_bad_one_names_its_key_and_value() {
        assert_eq!(parse::<u32>("limit", " 10\n"), Ok(10));
        assert_eq!(parse::<bool>("strict", "true"), Ok(true));
        assert_eq!(
            parse::<u32>("limit", "ten"),
            Err(HandlerError::Reject(
                "config `limit` = \"ten\" is invalid: invalid digit found in string".into()
            ))
        );
    }
}
