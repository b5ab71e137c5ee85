//! What the connectors' configuration unit tests share: a block parsed
//! from YAML, and the keys its problems point at.

use serde::de::DeserializeOwned;

use super::ConfigProblem;

/// A connector block parsed from `yaml`, as the pipeline file's parser
/// reads it; panics with the parser's reason.
pub(crate) fn block<T: DeserializeOwned>(yaml: &str) -> T {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("not a valid block: {e}\n{yaml}"))
}

/// Every key of every problem's path, in order: `["stream", "tls_ca"]`.
pub(crate) fn problem_paths(problems: &[ConfigProblem]) -> Vec<&'static str> {
    problems.iter().flat_map(|p| p.path.clone()).collect()
}
