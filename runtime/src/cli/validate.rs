//! `sluice validate`: check pipeline files without running them.
//!
//! Prints `ok: <file> (pipeline <name>: N stages)` per pipeline and exits 0,
//! or prints every problem as `file:line:col: message` on stderr and exits 2.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config;
use crate::connect::ConfigProblem;
use crate::plugin::{HostConfig, PluginCheck};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Pipeline files, or directories of them (`*.yaml`, `*.yml`).
    #[arg(required = true, value_name = "FILE|DIR")]
    paths: Vec<PathBuf>,
    /// Do not load the plugins: check only the YAML (faster; misses a plugin
    /// that is missing or not a Sluice plugin).
    #[arg(long)]
    no_plugins: bool,
    #[command(flatten)]
    cache: super::args::CacheArgs,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let result = if args.no_plugins {
        config::load(&args.paths)
    } else {
        // Loading a plugin creates no instance.
        let host = match args.cache.host(HostConfig {
            max_instances: 1,
            ..HostConfig::default()
        }) {
            Ok(host) => host,
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::from(2);
            }
        };
        config::load_checked(&args.paths, &mut PluginCheck::new(&host))
    };
    match result {
        Ok(pipelines) => {
            for p in pipelines {
                // Valid, but worth saying (a source that is at most once,
                // a password sent unencrypted).
                let warn = |what: &str, name: &str, kind: &str, w: &ConfigProblem| {
                    eprintln!(
                        "warning: {}: {what} `{name}` ({kind}.{}): {}",
                        p.source.display(),
                        w.path.join("."),
                        w.message
                    );
                };
                for source in &p.sources {
                    for connector in source.connectors() {
                        for w in connector.warnings() {
                            warn("source", &source.name, connector.kind(), &w);
                        }
                    }
                }
                for sink in p.stages.iter().filter_map(|s| s.sink.as_ref()) {
                    for connector in sink.connectors() {
                        for w in connector.warnings() {
                            warn("sink", &sink.name, connector.kind(), &w);
                        }
                    }
                }
                let n = p.stages.len();
                println!(
                    "ok: {} (pipeline {}: {n} stage{})",
                    p.source.display(),
                    p.name,
                    if n == 1 { "" } else { "s" }
                );
            }
            ExitCode::SUCCESS
        }
        Err(diagnostics) => {
            eprintln!("{diagnostics}");
            let n = diagnostics.len();
            eprintln!("{n} problem{} found", if n == 1 { "" } else { "s" });
            ExitCode::from(2)
        }
    }
}
