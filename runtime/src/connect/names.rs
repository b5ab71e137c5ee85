//! Names that connectors put into SQL and commands: checked here, never
//! spliced unchecked (the checks themselves are config's, which `validate`
//! runs: `crate::config::connectors::names`); and this daemon's own name
//! among several.

pub use crate::config::connectors::names::{check_plain_name, check_sql_identifier};

/// `<host>-<pid>`, made a plain name (`[A-Za-z0-9_.-]`): how this daemon
/// names itself to others, as a Redis consumer, an AMQP consumer tag, or
/// in the NATS bucket of configuration versions.
pub fn this_daemon() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let host = if host.is_empty() {
        "sluice".into()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

/// A Postgres object name made from `base` (`<table>_sluice_notify`): as
/// it is when it fits Postgres's 63 bytes, else its first 54 bytes and 8
/// hex digits of a hash of the whole, so that two long names sharing a
/// prefix never share an object (Postgres would cut both to the same 63).
pub fn sql_object_name(base: &str) -> String {
    if base.len() <= 63 {
        return base.to_owned();
    }
    // FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
    let hash = base.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let cut = (0..=54)
        .rev()
        .find(|&i| base.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}_{hash:08x}", &base[..cut])
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
        let why = check_sql_identifier("App.Orders_Outbox", true).expect_err("capitals");
        assert!(why.contains("write `app.orders_outbox`"), "{why}");
    }

    #[test]
    fn long_object_names_fit_postgres_and_stay_distinct() {
        assert_eq!(sql_object_name("t_sluice_notify"), "t_sluice_notify");
        let long = |tail: &str| sql_object_name(&format!("{}{tail}_sluice_notify", "x".repeat(49)));
        let (a, b) = (long("aaaaaaaaaaaaaa"), long("aaaaaaaaaaaaab"));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, long("aaaaaaaaaaaaaa"));
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
