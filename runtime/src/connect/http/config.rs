//! The `http:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::http`.

use super::sink::{HttpSink, HttpSinkParts};
pub(crate) use crate::config::connectors::http::*;
use async_trait::async_trait;
use reqwest::Method;

use crate::config::SinkBlock;
use crate::connect::{BuildError, Context, Sink, SinkConfig};

#[async_trait]
impl SinkConfig for HttpSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let refuse = |message: String| BuildError::sink(ctx, message);
        let problems = self.check();
        if let Some(problem) = problems.first() {
            return Err(refuse(problem.message.clone()));
        }
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|e| refuse(format!("`{}` is not a method: {e}", self.method)))?;
        let headers = self.header_map().map_err(refuse)?;
        let files = self.tls.files();
        let roots = files.roots().map_err(refuse)?;
        let identity = files.identity().map_err(refuse)?;
        let sink = HttpSink::new(HttpSinkParts {
            url: self.url.clone(),
            method,
            secret: self.secret.as_ref().map(|s| s.expose().as_bytes().to_vec()),
            headers,
            timeout: self.timeout.get(),
            roots,
            identity,
        })
        .map_err(refuse)?;
        Ok(std::sync::Arc::new(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(yaml: &str) -> HttpSinkConfig {
        serde_saphyr::from_str(yaml).expect("an http block")
    }

    fn problems(yaml: &str) -> Vec<(Vec<&'static str>, String)> {
        config(yaml)
            .check()
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect()
    }

    #[test]
    fn a_good_block_has_no_problems_and_describes_itself_without_secrets() {
        let c = config("url: https://u:pw-x1@hooks.example/in\nsecret: s3\nheaders: {X-Team: a}\n");
        assert!(c.check().is_empty());
        assert_eq!(c.describe(), "POST https://***:***@hooks.example/in");
        assert_eq!(c.method, "POST");
        assert_eq!(c.timeout.get(), std::time::Duration::from_secs(10));
    }

    #[test]
    fn bad_values_are_reported_at_their_keys() {
        let found =
            problems("url: https://hooks.example/in\nsecret: ''\nheaders: {'bad name': x}\n");
        let paths: Vec<&str> = found.iter().map(|(p, _)| p[0]).collect();
        assert_eq!(paths, ["secret", "headers"], "{found:?}");
        assert!(found[1].1.contains("`bad name`"), "{found:?}");
        let found = problems("url: https://hooks.example/in\nheaders: {Sluice-Header-X: y}\n");
        assert!(found[0].1.contains("set by the sink itself"), "{found:?}");
        let found = problems("url: https://hooks.example/in\nheaders: {X-A: \"a\\u0001b\"}\n");
        assert!(
            found[0].1.contains("not a valid HTTP header value"),
            "{found:?}"
        );
    }

    #[test]
    fn a_relative_tls_ca_is_resolved_against_the_pipeline_directory() {
        let mut c = config("url: https://hooks.example/in\ntls_ca: certs/ca.pem\n");
        c.resolve_paths(Path::new("/etc/sluice"));
        assert_eq!(
            c.tls.tls_ca.as_deref(),
            Some(Path::new("/etc/sluice/certs/ca.pem"))
        );
        let mut c = config("url: https://hooks.example/in\ntls_ca: /abs/ca.pem\n");
        c.resolve_paths(Path::new("/etc/sluice"));
        assert_eq!(c.tls.tls_ca.as_deref(), Some(Path::new("/abs/ca.pem")));
    }
}
