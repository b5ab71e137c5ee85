//! A stage as the plugin host runs it: the one conversion from a
//! pipeline file's [`Stage`] to the host's [`WorkerSettings`] (limits,
//! `config:` map, declared outputs, granted secrets), the capabilities it
//! grants, and its outbound HTTP sender. Config describes the stage; this
//! is where it meets the host.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{
    Capability, GuestSecrets, Isolation, Limits, Outbound, OutboundPolicy, Outputs, WorkerSettings,
};
use crate::config::{AllowedHost, SecretValues, Stage};
use crate::metrics::Metrics;

impl Stage {
    /// What the stage grants its plugin (contract 0.2.0's capabilities).
    pub fn grants(&self) -> Vec<Capability> {
        let mut granted = Vec::new();
        if !self.secrets.is_empty() {
            granted.push(Capability::Secrets);
        }
        if self.http.is_some() {
            granted.push(Capability::Http);
        }
        if self.state.is_some() {
            granted.push(Capability::State);
        }
        granted
    }

    /// The plugin host's settings for one worker of this stage: its limits,
    /// its `config:` map and its declared outputs. The engine creates
    /// `concurrency` workers with these.
    pub fn worker_settings(&self) -> WorkerSettings {
        self.worker_settings_with(&SecretValues::default())
    }

    /// [`Stage::worker_settings`] with the values of the secrets the stage
    /// lists, from its pipeline's `secrets` (a name it does not define was
    /// refused by validation).
    pub fn worker_settings_with(&self, secrets: &SecretValues) -> WorkerSettings {
        WorkerSettings {
            limits: Limits {
                timeout: self.delivery.timeout.get(),
                memory: usize::try_from(self.memory.bytes()).unwrap_or(usize::MAX),
                ..Limits::default()
            },
            config: Arc::new(
                self.config
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value.clone()))
                    .collect(),
            ),
            outputs: Outputs::Declared(self.publish.clone()),
            timer_topics: if self.timers {
                self.subscribe.topics.clone()
            } else {
                Vec::new()
            },
            secrets: GuestSecrets::new(
                &self.name,
                self.secrets
                    .iter()
                    .filter_map(|name| Some((name.clone(), secrets.expose(name)?.to_owned())))
                    .collect(),
            )
            .also_redacting(self.header_secrets(secrets)),
            // The daemon adds the broker's store (`Stage::state_store`)
            // and the outbound sender (`Stage::outbound`).
            state: None,
            http: None,
            isolation: Isolation::Reuse,
        }
    }

    /// The outbound sender this stage's `http:` grants, if any, counting
    /// its requests in `metrics` (with the pipeline's name).
    ///
    /// # Errors
    ///
    /// The client cannot be set up (validation refuses bad grants first).
    pub fn outbound(
        &self,
        metrics: Option<(String, Arc<Metrics>)>,
    ) -> Result<Option<Arc<Outbound>>, String> {
        let Some(grant) = &self.http else {
            return Ok(None);
        };
        let allow = grant
            .allow
            .iter()
            .map(|entry| AllowedHost::parse(entry))
            .collect::<Result<Vec<_>, _>>()?;
        let headers = grant
            .headers
            .iter()
            .map(|(host, list)| {
                Ok((
                    AllowedHost::parse(host)?,
                    list.iter()
                        .map(|(name, value)| (name.clone(), value.expose().to_owned()))
                        .collect(),
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let timeout = grant.timeout.map_or(self.delivery.timeout.get(), |t| {
            t.get().min(self.delivery.timeout.get())
        });
        Outbound::new(
            &self.name,
            OutboundPolicy {
                allow,
                allow_private: grant.allow_private,
                timeout: Some(timeout),
                headers,
                metrics,
            },
        )
        .map(Some)
    }

    /// The secrets this stage's `http:` headers put in, by name.
    fn header_secrets<'a>(&'a self, values: &'a SecretValues) -> BTreeMap<String, String> {
        self.http
            .iter()
            .flat_map(|grant| grant.headers.values())
            .flat_map(|list| list.values())
            .flat_map(|text| crate::config::secrets::referenced(text.written()))
            .filter_map(|name| Some((name.to_owned(), values.expose(name)?.to_owned())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_limits_map_onto_the_plugin_host() {
        let stage: Stage = crate::config::parse_yaml(
            "name: s\nsubscribe: {topic: in, filter: {kind: a}}\nplugin: p.wasm\n\
             publish: [out, other]\ntimeout: 2s\nmemory: 64MiB\nconfig: {n: 3, on: true, t: x}\n",
        )
        .map(|(stage, _)| stage)
        .unwrap_or_else(|e| panic!("{e:?}"));
        let settings = stage.worker_settings();
        assert_eq!(settings.limits.timeout, std::time::Duration::from_secs(2));
        assert_eq!(settings.limits.memory, 64 << 20);
        assert_eq!(
            settings.outputs,
            Outputs::Declared(vec!["out".into(), "other".into()])
        );
        assert_eq!(settings.config.get("n").map(String::as_str), Some("3"));
        assert_eq!(settings.config.get("on").map(String::as_str), Some("true"));
        assert_eq!(
            stage.subscribe.filter.get("kind").map(String::as_str),
            Some("a")
        );
    }
}
