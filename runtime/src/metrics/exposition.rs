//! The OpenMetrics text prometheus-client writes, rewritten into the
//! Prometheus text format 0.0.4 for scrapers that ask for that.

/// Rewrites OpenMetrics text into Prometheus text format 0.0.4.
pub(super) fn openmetrics_to_prometheus(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len() + 16 * counters.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            (counters.contains(name) && !name.ends_with("_total"))
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match rewritten {
            Some(line) => out.push_str(line.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::metrics::Metrics;

    #[test]
    fn prometheus_text_names_counter_families_with_total_and_has_no_eof() {
        let metrics = Metrics::new();
        metrics.count_published("orders", 3);
        let om = metrics.encode();
        assert!(
            om.contains("# TYPE sluice_messages_published counter"),
            "{om}"
        );
        assert!(om.trim_end().ends_with("# EOF"));
        let text = metrics.encode_prometheus();
        assert!(
            text.contains("# TYPE sluice_messages_published_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# HELP sluice_messages_published_total "),
            "{text}"
        );
        assert!(text.contains("sluice_messages_published_total{topic=\"orders\"} 3"));
        assert!(!text.contains("# EOF"));
        assert!(text.contains("# TYPE process_open_fds gauge"), "{text}");
        assert!(text.contains("# TYPE sluice_ingest_responses_total counter"));
        assert!(text.contains("sluice_build_info{version="));
    }
}
