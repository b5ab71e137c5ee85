//! The plugin host in-process, for tests of the host itself: one host per
//! test binary, and the plugins freshly built from source by the harness.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sluice::plugin::{HostConfig, Limits, Message, Outputs, Plugin, PluginHost, WorkerSettings};

/// One host for the whole test binary, as the daemon has one.
pub static HOST: LazyLock<PluginHost> = LazyLock::new(|| {
    PluginHost::new(HostConfig {
        max_memory: 1 << 30,
        max_instances: 64,
        ..HostConfig::default()
    })
    .expect("the plugin host starts")
});

/// Loads a plugin built from `plugins/` by the harness.
pub fn plugin(name: &str) -> Plugin {
    HOST.load(sluice_harness::plugin(name))
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Worker settings with a config map and short, test-friendly limits.
pub fn settings(config: &[(&str, &str)]) -> WorkerSettings {
    WorkerSettings {
        limits: Limits {
            timeout: Duration::from_secs(10),
            ..Limits::default()
        },
        config: Arc::new(
            config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        outputs: Outputs::Any {
            default: "out".into(),
        },
        ..WorkerSettings::default()
    }
}

/// A message with a payload.
pub fn msg(payload: &str) -> Message {
    Message::new("id-1", "in", payload.as_bytes().to_vec())
}
