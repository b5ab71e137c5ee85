//! A stage's grants, checked: `state:` (a store name, a size, one size per
//! shared store) and `http:` (hosts, timeout, headers).

use std::collections::HashMap;

use crate::config::tree::Seg;

use super::pipeline::valid_name;

/// A stage's `state:`: a valid store name, a size, one world that can
/// commit state, and one size per shared store.
pub(super) fn check_state(
    report: &mut impl FnMut(&[Seg<'_>], String),
    at: &impl Fn(&[Seg<'static>]) -> Vec<Seg<'static>>,
    stage: &crate::config::Stage,
    grant: &crate::config::StateGrant,
    stores: &mut HashMap<String, (String, u64)>,
) {
    use Seg::Key as K;
    let store = grant.store_or(&stage.name);
    if grant.store.is_some() && !valid_name(store) {
        report(
            &at(&[K("state"), K("store")]),
            format!(
                "`{store}` is not a valid store name; use lowercase letters, digits, `_`, `-` \
                 and `.` (e.g. `charges`)"
            ),
        );
    }
    if grant.max_bytes.bytes() == 0 {
        report(
            &at(&[K("state"), K("max_bytes")]),
            "`max_bytes` must be more than 0 (e.g. `64MiB`)".into(),
        );
    }
    if stage.delivery.batch.is_some() {
        report(
            &at(&[K("state")]),
            format!(
                "stage `{}` has both `state:` and `batch:`; state commits with one message's \
                 outcome, and a batch's items settle one by one, so use one or the other",
                stage.name
            ),
        );
    }
    match stores.get(store) {
        Some((first, max)) if *max != grant.max_bytes.bytes() => report(
            &at(&[K("state"), K("max_bytes")]),
            format!(
                "stage `{}` shares the state store `{store}` with stage `{first}` but gives it \
                 another `max_bytes`; a shared store has one limit, so give both the same",
                stage.name
            ),
        ),
        Some(_) => {}
        None => {
            stores.insert(
                store.to_owned(),
                (stage.name.clone(), grant.max_bytes.bytes()),
            );
        }
    }
}

/// A stage's `http:` grant: hosts that parse, headers only for listed
/// hosts, header names and values HTTP can carry.
pub(super) fn check_http(
    report: &mut impl FnMut(&[Seg<'_>], String),
    at: &impl Fn(&[Seg<'static>]) -> Vec<Seg<'static>>,
    grant: &crate::config::HttpGrant,
) {
    use Seg::{Index as I, Key as K};
    if grant.allow.is_empty() {
        report(
            &at(&[K("http"), K("allow")]),
            "`allow` lists no host, so no request could be made; list the hosts the handler \
             calls (e.g. `allow: [api.example.com]`)"
                .into(),
        );
    }
    let mut allowed = Vec::new();
    for (i, entry) in grant.allow.iter().enumerate() {
        match crate::config::AllowedHost::parse(entry) {
            Ok(host) => allowed.push(host),
            Err(why) => report(&at(&[K("http"), K("allow"), I(i)]), why),
        }
    }
    if grant.timeout.is_some_and(|t| t.get().is_zero()) {
        report(
            &at(&[K("http"), K("timeout")]),
            "`timeout` must be more than 0 (e.g. `5s`)".into(),
        );
    }
    let headers_at = at(&[K("http"), K("headers")]);
    fn under<'a>(base: &[Seg<'static>], host: &'a str, name: Option<&'a str>) -> Vec<Seg<'a>> {
        let mut path: Vec<Seg<'a>> = base.to_vec();
        path.push(Seg::Key(host));
        path.extend(name.map(Seg::Key));
        path
    }
    for (host, headers) in &grant.headers {
        let listed = crate::config::AllowedHost::parse(host)
            .is_ok_and(|h| allowed.iter().any(|a| a.host == h.host && a.port == h.port));
        if !listed {
            report(
                &under(&headers_at, host, None),
                format!(
                    "`headers` for `{host}`, which is not in `allow`; headers go only to a \
                     listed host (as written there, port included)"
                ),
            );
        }
        for (name, value) in headers {
            let path = under(&headers_at, host, Some(name));
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                report(&path, format!("`{name}` is not an HTTP header name"));
            } else if crate::config::is_reserved_header(name) {
                report(
                    &path,
                    format!("`{name}` belongs to the connection; the sender writes it"),
                );
            }
            if http::HeaderValue::from_str(value.expose()).is_err() {
                report(
                    &path,
                    format!(
                        "header `{name}`: its value (`{}`) cannot be sent in a header (line \
                         breaks or control characters, here or in a secret it uses)",
                        value.written()
                    ),
                );
            }
        }
    }
}
