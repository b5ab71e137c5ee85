//! The checks of one stage or sink, by concern, in the order they have
//! always run: secrets, name, inputs, outputs and dead letters, retry,
//! limits, dedup, the `state:` and `http:` grants, a sink's connector
//! block.

use std::collections::{BTreeSet, HashSet};

use crate::config::Stage;
use crate::config::model::{Priority, default_dlq};
use crate::config::tree::Seg;

use super::grants::{check_http, check_state};
use super::pipeline::{Checker, check_connector_blocks, valid_name};

use Seg::{Index as I, Key as K};

/// Where a stage is written: `stages[2]` or, for a sink, `sinks[0]`.
#[derive(Clone, Copy)]
struct Place {
    section: &'static str,
    index: usize,
    /// `stage` or `sink`, for messages.
    what: &'static str,
}

impl Place {
    /// The path to `rest` under this stage's entry.
    fn at(self, rest: &[Seg<'static>]) -> Vec<Seg<'static>> {
        let mut path = vec![K(self.section), I(self.index)];
        path.extend_from_slice(rest);
        path
    }
}

impl<'a> Checker<'a> {
    /// Every check of stage `i` (a plugin stage or a sink).
    pub(super) fn stage(&mut self, i: usize, stage: &'a Stage) {
        let (section, index, what) = self.origin(i);
        let place = Place {
            section,
            index,
            what,
        };
        self.stage_secrets(place, stage);
        self.stage_name(i, place, stage);
        let subscribed = self.stage_inputs(place, stage);
        self.stage_outputs(place, stage, &subscribed);
        self.stage_retry(place, stage);
        self.stage_limits(place, stage);
        self.stage_dedup(place, stage);
        if let Some(grant) = &stage.state {
            check_state(
                &mut |path, message| self.out.push(path, message),
                &|rest| place.at(rest),
                stage,
                grant,
                &mut self.stores,
            );
        }
        if let Some(grant) = &stage.http {
            check_http(
                &mut |path, message| self.out.push(path, message),
                &|rest| place.at(rest),
                grant,
            );
        }
        if let Some(sink) = &stage.sink {
            let blocks = sink.blocks();
            check_connector_blocks(
                &mut |path, message| self.out.push(path, message),
                &place.at(&[]),
                "sink",
                &sink.name,
                crate::config::SinkDef::KINDS,
                blocks.iter().map(|c| (c.kind(), c.check())).collect(),
            );
        }
    }

    /// No `{secret:...}` in `config:`, and each secret the stage lists is
    /// defined by the pipeline and listed once.
    fn stage_secrets(&mut self, place: Place, stage: &Stage) {
        for (key, value) in &stage.config {
            if value.value.contains(crate::config::secrets::OPEN) {
                self.out.push(
                    &[
                        K(place.section),
                        I(place.index),
                        K("config"),
                        K(key.as_str()),
                    ],
                    format!(
                        "`config.{key}` holds a `{{secret:...}}` reference, which is not \
                         resolved in `config:` (its values are shown to operators); list the \
                         secret under the stage's `secrets:` and read it from the handler \
                         (contract 0.2.0), and a connector's password and token fields take \
                         `{{secret:name}}`"
                    ),
                );
            }
        }
        let p = self.p;
        let mut listed = HashSet::new();
        for (j, name) in stage.secrets.iter().enumerate() {
            if !p.secrets.contains_key(name) {
                let defined: Vec<&str> = p.secrets.keys().map(String::as_str).collect();
                self.out.push(
                    &place.at(&[K("secrets"), I(j)]),
                    format!(
                        "stage `{}` lists the secret `{name}`, which the pipeline's `secrets:` \
                         block does not define ({}); add `{name}: {{env: VAR}}` or \
                         `{name}: {{file: PATH}}` there",
                        stage.name,
                        if defined.is_empty() {
                            "it defines none".to_owned()
                        } else {
                            format!("it defines: {}", defined.join(", "))
                        }
                    ),
                );
            } else if !listed.insert(name.as_str()) {
                self.out.push(
                    &place.at(&[K("secrets"), I(j)]),
                    format!("stage `{}` lists the secret `{name}` twice", stage.name),
                );
            }
        }
    }

    /// A valid name, unique among the pipeline's stages and sinks.
    fn stage_name(&mut self, i: usize, place: Place, stage: &'a Stage) {
        if !valid_name(&stage.name) {
            self.out.push(
                &place.at(&[K("name")]),
                format!(
                    "`{}` is not a valid stage name; use lowercase letters, digits, `_`, `-` \
                     and `.` (e.g. `route`)",
                    stage.name
                ),
            );
        }
        if let Some(first) = self.stage_names.insert(&stage.name, i) {
            let (section, index, _) = self.origin(first);
            let (_, _, kind) = self.origin(i);
            let line = self.line(&[K(section), I(index)]);
            self.out.push(
                &place.at(&[K("name")]),
                format!(
                    "{kind} `{}` is defined twice (first on line {line}); stage, sink and \
                     source names must be unique in a pipeline",
                    stage.name
                ),
            );
            self.stage_names.insert(&stage.name, first);
        }
    }

    /// `subscribe:`: each topic declared (or an implicit dead-letter
    /// topic) and listed once, weights for exactly the topics listed, no
    /// empty filter header. Gives the topics subscribed to.
    fn stage_inputs<'s>(&mut self, place: Place, stage: &'s Stage) -> BTreeSet<&'s str> {
        let lanes = stage.subscribe.has_lanes() || stage.subscribe.priority.is_some();
        let mut subscribed = BTreeSet::new();
        for (j, input) in stage.subscribe.topics.iter().enumerate() {
            let path = if lanes {
                place.at(&[K("subscribe"), K("topics"), I(j)])
            } else {
                place.at(&[K("subscribe"), K("topic")])
            };
            if !subscribed.insert(input.as_str()) {
                self.out.push(
                    &path,
                    format!("`{input}` is listed twice under `topics`; list each topic once"),
                );
            }
            if !self.declared.contains_key(input.as_str()) && !self.implicit_dlqs.contains(input) {
                let declared = self.declared_list();
                self.out.push(
                    &path,
                    format!(
                        "{} `{}` subscribes to `{input}`, which is not declared under `topics:`; {}",
                        place.what, stage.name, declared
                    ),
                );
            }
        }
        if let Some(Priority::Weighted(weights)) = &stage.subscribe.priority {
            let path = place.at(&[K("subscribe"), K("priority"), K("weighted")]);
            for topic in weights.keys() {
                if !subscribed.contains(topic.as_str()) {
                    self.out.push(
                        &path,
                        format!(
                            "`{topic}` has a weight but is not among `topics`; weigh only the \
                             topics the stage subscribes to"
                        ),
                    );
                }
            }
            let missing: Vec<&str> = subscribed
                .iter()
                .copied()
                .filter(|topic| !weights.contains_key(*topic))
                .collect();
            if !missing.is_empty() {
                self.out.push(
                    &path,
                    format!(
                        "give every subscribed topic a weight (at least 1); missing: {}",
                        missing.join(", ")
                    ),
                );
            }
        }
        for header in stage.subscribe.filter.keys() {
            if header.trim().is_empty() {
                self.out.push(
                    &place.at(&[K("subscribe"), K("filter")]),
                    "a filter header name cannot be empty".into(),
                );
            }
        }
        subscribed
    }

    /// `publish:` and `dlq:`: declared topics, listed once, none of them
    /// the stage's own input.
    fn stage_outputs(&mut self, place: Place, stage: &Stage, subscribed: &BTreeSet<&str>) {
        let what = place.what;
        let mut seen = BTreeSet::new();
        for (j, topic) in stage.publish.iter().enumerate() {
            let path = place.at(&[K("publish"), I(j)]);
            if !self.declared.contains_key(topic.as_str()) {
                let declared = self.declared_list();
                self.out.push(
                    &path,
                    format!(
                        "{what} `{}` publishes to `{topic}`, which is not declared under \
                         `topics:`; {}",
                        stage.name, declared
                    ),
                );
            }
            if subscribed.contains(topic.as_str()) && !stage.timers {
                self.out.push(
                    &path,
                    format!(
                        "{what} `{}` publishes to `{topic}`, its own input: every output would \
                         come back to it (a handler that schedules work for itself with \
                         delayed emits sets `timers: true`)",
                        stage.name
                    ),
                );
            }
            if !seen.insert(topic) {
                self.out
                    .push(&path, format!("`{topic}` is listed twice under `publish:`"));
            }
        }

        if let Some(archive) = stage.delivery.dlq_archive() {
            for problem in archive.check() {
                let mut path = place.at(&[K("dlq"), K("archive")]);
                path.extend(problem.path.iter().map(|k| K(k)));
                self.out.push(&path, problem.message);
            }
        }
        if let Some(dlq) = stage.delivery.dlq_name() {
            let path = place.at(&[K("dlq")]);
            if !self.declared.contains_key(dlq) && !self.implicit_dlqs.contains(dlq) {
                let declared = self.declared_list();
                self.out.push(
                    &path,
                    format!(
                        "{what} `{}` dead-letters to `{dlq}`, which is not declared under \
                         `topics:` (only the default `{}` needs no declaration); {}",
                        stage.name,
                        default_dlq(&self.p.name, &stage.name),
                        declared
                    ),
                );
            }
            if subscribed.contains(dlq) {
                self.out.push(
                    &path,
                    format!(
                        "{what} `{}` dead-letters to `{dlq}`, its own input: failed messages \
                         would be retried forever",
                        stage.name
                    ),
                );
            }
        }
    }

    /// `retry:`: a backoff that grows and stays under a year, or a
    /// schedule of waits that is not empty and stays under a year.
    fn stage_retry(&mut self, place: Place, stage: &Stage) {
        let backoff = &stage.delivery.retry.backoff;
        if !(backoff.multiplier.is_finite() && backoff.multiplier >= 1.0) {
            self.out.push(
                &place.at(&[K("retry"), K("backoff"), K("multiplier")]),
                format!(
                    "`multiplier` is {}; it must be at least 1 (1 = a constant delay)",
                    backoff.multiplier
                ),
            );
        }
        if !(0.0..=1.0).contains(&backoff.jitter) {
            self.out.push(
                &place.at(&[K("retry"), K("backoff"), K("jitter")]),
                format!(
                    "`jitter` is {}; it must be between 0 (no jitter) and 1",
                    backoff.jitter
                ),
            );
        }
        if backoff.initial > backoff.max {
            self.out.push(
                &place.at(&[K("retry"), K("backoff"), K("initial")]),
                format!(
                    "the first backoff delay ({}) is longer than the longest ({})",
                    backoff.initial, backoff.max
                ),
            );
        }
        if backoff.max.get() > crate::timestamp::MAX_DELAY {
            self.out.push(
                &place.at(&[K("retry"), K("backoff"), K("max")]),
                format!(
                    "the longest backoff delay ({}) is over the limit of 365 days",
                    backoff.max
                ),
            );
        }
        if let Some(waits) = &stage.delivery.retry.schedule {
            if waits.is_empty() {
                self.out.push(
                    &place.at(&[K("retry"), K("schedule")]),
                    "`schedule` is empty: list the waits before each retry, like [1m, 5m, 30m], or remove it to use `backoff`".to_owned(),
                );
            }
            if let Some(long) = waits.iter().find(|w| w.get() > crate::timestamp::MAX_DELAY) {
                self.out.push(
                    &place.at(&[K("retry"), K("schedule")]),
                    format!("a wait of {long} is over the limit of 365 days"),
                );
            }
        }
    }

    /// `ack_wait`, `timeout`, `memory` and `max_ack_pending` in range.
    fn stage_limits(&mut self, place: Place, stage: &Stage) {
        for (key, value) in [
            ("ack_wait", stage.delivery.ack_wait),
            ("timeout", stage.delivery.timeout),
        ] {
            if value.get().is_zero() {
                self.out.push(
                    &place.at(&[K(key)]),
                    format!("`{key}` must be longer than 0s"),
                );
            }
        }
        let memory = stage.memory.bytes();
        if !(1 << 20..=4 << 30).contains(&memory) {
            self.out.push(
                &place.at(&[K("memory")]),
                format!(
                    "`memory` is {}; it must be between 1MiB and 4GiB (a 32-bit memory)",
                    stage.memory
                ),
            );
        }
        if stage.delivery.max_ack_pending == Some(0) {
            self.out.push(
                &place.at(&[K("max_ack_pending")]),
                "`max_ack_pending` must be at least 1 (leave it out for no limit)".into(),
            );
        }
        self.files_fit_in_flight(place, stage);
    }

    /// An object-store sink's records stay in flight until their file is
    /// uploaded, so `max_ack_pending` caps the records a file can reach:
    /// one below `roll.max_records` would leave that limit unreachable
    /// (files would close only by size or age), which is refused, naming
    /// both. Left out, it is raised to fit (`SinkDef::to_stage`).
    fn files_fit_in_flight(&mut self, place: Place, stage: &Stage) {
        let Some(block) = stage.sink.as_ref().and_then(|s| s.object_store.as_ref()) else {
            return;
        };
        let records = block.roll.max_records.get();
        if let Some(pending) = stage.delivery.max_ack_pending
            && u64::from(pending) < records
        {
            self.out.push(
                &place.at(&[K("max_ack_pending")]),
                format!(
                    "`max_ack_pending` ({pending}) is below `roll.max_records` ({records}): a \
                     file's records stay unacked until it is uploaded, so no file could reach \
                     {records} records; raise `max_ack_pending`, lower `max_records`, or leave \
                     `max_ack_pending` out (it is then raised to fit)"
                ),
            );
        }
    }

    /// `dedup:`: a `ttl` that outlives a handler's lease, and no `batch:`.
    fn stage_dedup(&mut self, place: Place, stage: &Stage) {
        let Some(dedup) = &stage.delivery.dedup else {
            return;
        };
        let lease = stage.delivery.timeout.get() + crate::config::LEASE_MARGIN;
        if dedup.ttl.get().is_zero() {
            self.out.push(
                &place.at(&[K("dedup"), K("ttl")]),
                "`ttl` must be longer than 0s (leave `dedup:` out for no dedup)".into(),
            );
        } else if dedup.ttl.get() < lease {
            self.out.push(
                &place.at(&[K("dedup"), K("ttl")]),
                format!(
                    "`ttl` ({}) must be at least the stage's `timeout` plus 5s ({}): a key \
                     would expire while its handler still runs, and a copy of the message \
                     could run too",
                    humantime::format_duration(dedup.ttl.get()),
                    humantime::format_duration(lease)
                ),
            );
        }
        if stage.delivery.batch.is_some() {
            self.out.push(
                &place.at(&[K("dedup")]),
                format!(
                    "{} `{}` has both `dedup:` and `batch:`; dedup works per message, \
                     so use one or the other",
                    place.what, stage.name
                ),
            );
        }
    }
}
