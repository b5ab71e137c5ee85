//! Each stage's plugin file, checked while its pipeline file is loaded
//! (`sluice validate`, the daemon's start and reload): the loader's
//! [`PipelineCheck`] that needs the host.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{Inspection, PluginHost, check_memory};
use crate::config::{Pipeline, PipelineCheck, Seg};

/// Inspects each distinct plugin file once, without compiling it (its
/// world, imports and declared memory: milliseconds, where a compile of a
/// Python or JS component takes seconds), and reports those that cannot be
/// used at every stage that names them, and stages whose `memory` is below
/// what their plugin needs to start. One check serves one load: it
/// remembers each file it inspected across that load's pipelines.
pub struct PluginCheck<'a> {
    host: &'a PluginHost,
    /// Each plugin file's outline and SHA-256, or why it cannot be used.
    results: HashMap<PathBuf, Result<(Inspection, String), String>>,
}

impl<'a> PluginCheck<'a> {
    /// A check that inspects plugin files with `host`.
    pub fn new(host: &'a PluginHost) -> Self {
        PluginCheck {
            host,
            results: HashMap::new(),
        }
    }
}

impl PipelineCheck for PluginCheck<'_> {
    fn check(&mut self, pipeline: &Pipeline) -> Vec<(Vec<Seg<'static>>, String)> {
        let mut problems = Vec::new();
        for (i, stage) in pipeline.stages.iter().enumerate() {
            if stage.is_sink() {
                continue;
            }
            let host = self.host;
            let result = self.results.entry(stage.plugin.clone()).or_insert_with(|| {
                if !stage.plugin.is_file() {
                    return Err(format!(
                        "plugin file not found: {} (a relative `plugin:` path is relative \
                             to the pipeline file's directory; `cargo xtask plugins` builds \
                             this repository's plugins into target/plugins/)",
                        stage.plugin.display()
                    ));
                }
                host.inspect(&stage.plugin).map_err(|e| e.to_string())
            });
            let (field, message) = match result {
                Err(message) => ("plugin", message.clone()),
                Ok((inspection, sha256)) => match stage.check_pin(sha256) {
                    Err(message) => ("sha256", message),
                    Ok(()) => match check_memory(
                        &stage.plugin,
                        inspection,
                        stage.memory.bytes(),
                        "the stage's `memory`",
                    ) {
                        Err(e) => ("memory", e.to_string()),
                        Ok(()) => match inspection.check_grants(
                            &stage.plugin,
                            &stage.name,
                            &stage.grants(),
                        ) {
                            Ok(()) => continue,
                            Err(e) => ("plugin", e.to_string()),
                        },
                    },
                },
            };
            problems.push((
                vec![Seg::Key("stages"), Seg::Index(i), Seg::Key(field)],
                message,
            ));
        }
        problems
    }
}
