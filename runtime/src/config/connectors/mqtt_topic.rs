//! MQTT topic names and filters: the source's filter is checked as the
//! broker would, and the sink's topic is a template that may hold the
//! message key, which is refused when it would change the topic's shape.

/// The longest topic MQTT can carry (a two-byte length).
const MAX_TOPIC: usize = u16::MAX as usize;

/// Whether `filter` is a valid MQTT topic filter: not empty, `#` only as
/// the whole last level, `+` only as a whole level, no NUL; or
/// `$share/<group>/<filter>` with such a filter.
pub fn check_filter(filter: &str) -> Result<(), String> {
    if filter.is_empty() {
        return Err("`topic` must not be empty; give a topic filter such as `orders/#`".into());
    }
    if filter.len() > MAX_TOPIC {
        return Err("`topic` is longer than MQTT allows (65535 bytes)".into());
    }
    if filter.contains('\0') {
        return Err("`topic` holds a NUL character".into());
    }
    let inner = match filter.strip_prefix("$share/") {
        Some(rest) => {
            let Some((group, inner)) = rest.split_once('/') else {
                return Err(format!(
                    "`{filter}`: a shared subscription is `$share/<group>/<filter>`"
                ));
            };
            if group.is_empty() || group.contains(['+', '#']) {
                return Err(format!(
                    "`{filter}`: the share group `{group}` must be a non-empty name without `+` \
                     or `#`"
                ));
            }
            if inner.is_empty() {
                return Err(format!("`{filter}`: the shared subscription has no filter"));
            }
            inner
        }
        None => filter,
    };
    let levels: Vec<&str> = inner.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Err(format!(
                "`{filter}` is not a valid topic filter: `#` must be a whole level, and the \
                 last (`orders/#`)"
            ));
        }
        if level.contains('+') && *level != "+" {
            return Err(format!(
                "`{filter}` is not a valid topic filter: `+` must be a whole level \
                 (`sensors/+/temp`)"
            ));
        }
    }
    Ok(())
}

/// The sink's topic: literal text, with `{key}` standing for the
/// message's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Key,
}

impl TopicTemplate {
    /// Parses and checks `template`: a topic name (no `+` or `#`, not
    /// starting with `$`, no NUL) whose only placeholder is `{key}`.
    pub fn parse(template: &str) -> Result<TopicTemplate, String> {
        if template.is_empty() {
            return Err("`topic` must not be empty; give a topic such as `out/{key}`".into());
        }
        if template.contains(['+', '#']) {
            return Err(format!(
                "`{template}`: a topic to publish to cannot hold the wildcards `+` or `#`"
            ));
        }
        if template.starts_with('$') {
            return Err(format!(
                "`{template}`: topics starting with `$` are the broker's own"
            ));
        }
        if template.contains('\0') {
            return Err("`topic` holds a NUL character".into());
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err(format!(
                    "`{template}`: a `}}` without its `{{`; the only placeholder is `{{key}}`"
                ));
            }
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let after = &rest[open..];
            let Some(close) = after.find('}') else {
                return Err(format!(
                    "`{template}`: a `{{` without its `}}`; the only placeholder is `{{key}}`"
                ));
            };
            let name = &after[1..close];
            if name != "key" {
                return Err(format!(
                    "`{template}`: unknown placeholder `{{{name}}}`; the only one is `{{key}}`"
                ));
            }
            parts.push(Part::Key);
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(TopicTemplate { parts })
    }

    /// Whether the topic depends on the key.
    pub fn uses_key(&self) -> bool {
        self.parts.contains(&Part::Key)
    }

    /// The topic for a message with `key`. A key the topic needs that is
    /// missing, empty, or holds `/`, `+`, `#` or a NUL (it would change
    /// the topic's levels, or be refused by the broker) is refused, with
    /// why: the message is dead-lettered, never published elsewhere.
    pub fn render(&self, key: Option<&str>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Key => {
                    let key = key.ok_or(
                        "the message has no key, and the sink's topic holds `{key}`".to_owned(),
                    )?;
                    check_key_level(key)?;
                    out.push_str(key);
                }
            }
        }
        if out.len() > MAX_TOPIC {
            return Err(format!(
                "the topic would be {} bytes, more than MQTT allows (65535)",
                out.len()
            ));
        }
        Ok(out)
    }
}

/// Whether `key` can stand in a topic as (part of) one level.
fn check_key_level(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the message key is empty, and the sink's topic holds `{key}`".into());
    }
    if let Some(c) = key.chars().find(|c| matches!(c, '/' | '+' | '#' | '\0')) {
        return Err(format!(
            "the message key {key:?} holds {c:?}, which would change the MQTT topic's levels \
             or make it a wildcard; such keys are refused, not escaped"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked_as_a_broker_would() {
        for ok in [
            "a",
            "a/b",
            "#",
            "a/#",
            "+",
            "+/b/+",
            "a//b",
            "$share/g/a/#",
            "$SYS/#",
        ] {
            assert!(check_filter(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a#",
            "a/#/b",
            "a+",
            "a/b+/c",
            "$share/g",
            "$share//a",
            "$share/g/",
            "a\0",
        ] {
            assert!(check_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_template_renders_the_key_and_refuses_injection() {
        let t = TopicTemplate::parse("out/{key}/x").expect("valid");
        assert!(t.uses_key());
        assert_eq!(t.render(Some("k1")).expect("renders"), "out/k1/x");
        for bad in ["a/b", "+", "#", "x#", "", "a\0"] {
            assert!(t.render(Some(bad)).is_err(), "{bad:?}");
        }
        assert!(t.render(None).is_err());
        let plain = TopicTemplate::parse("out").expect("valid");
        assert!(!plain.uses_key());
        assert_eq!(plain.render(None).expect("renders"), "out");
        assert_eq!(plain.render(Some("a/b")).expect("renders"), "out");
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in [
            "", "out/+", "out/#", "$SYS/x", "out/{id}", "out/{key", "out/}", "{",
        ] {
            assert!(TopicTemplate::parse(bad).is_err(), "{bad}");
        }
    }
}
