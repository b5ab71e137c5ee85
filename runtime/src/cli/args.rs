//! Value parsers shared by subcommands, so every flag that takes a duration,
//! a size or a `K=V` pair accepts the same spellings and fails the same way.

use std::path::PathBuf;
use std::time::Duration;

use crate::plugin::{HostConfig, HostError, PluginHost};

/// Where compiled plugins are cached: one set of flags for every command that
/// loads plugins, so they resolve the cache the same way.
#[derive(Debug, clap::Args)]
pub(crate) struct CacheArgs {
    /// Cache compiled plugins here [default: $XDG_CACHE_HOME/sluice/components or
    /// ~/.cache/sluice/components].
    #[arg(long, env = "SLUICE_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile plugins every time instead of using the cache.
    #[arg(long)]
    no_cache: bool,
    /// Size cap of the cache: past it, the least recently used compiled
    /// plugins are deleted [default: 1GiB].
    #[arg(long, env = "SLUICE_CACHE_MAX_SIZE", value_name = "SIZE", value_parser = byte_size)]
    cache_max_size: Option<usize>,
}

impl CacheArgs {
    /// A plugin host set up as `config` says, with this cache.
    pub(crate) fn host(&self, config: HostConfig) -> Result<PluginHost, HostError> {
        PluginHost::new(HostConfig {
            cache_dir: self.dir(),
            cache_max_bytes: self.max_bytes(),
            ..config
        })
    }

    /// The cache's size cap these flags choose.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.cache_max_size
            .map_or(crate::plugin::DEFAULT_CACHE_MAX_BYTES, |size| {
                u64::try_from(size).unwrap_or(u64::MAX)
            })
    }

    /// The cache directory these flags choose (None: no cache).
    pub(crate) fn dir(&self) -> Option<PathBuf> {
        match self.no_cache {
            true => None,
            false => self.cache_dir.clone().or_else(default_cache_dir),
        }
    }
}

/// Where compiled plugins are cached unless `--cache-dir`/`SLUICE_CACHE_DIR` says otherwise.
fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("sluice").join("components"))
}

/// `30s`, `250ms`, `1m 30s`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e}; expected a duration such as `500ms`, `30s` or `2m`"))
}

/// `67108864`, `64MiB`, `64 MB`, `1GiB`.
pub(crate) fn byte_size(text: &str) -> Result<usize, String> {
    let size: bytesize::ByteSize = text.parse().map_err(|e| {
        format!("{e}; expected a size such as `64MiB`, `512KiB` or a number of bytes")
    })?;
    usize::try_from(size.as_u64()).map_err(|_| format!("{text} is too large"))
}

/// `name=value`; the value may contain `=`.
pub(crate) fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not of the form NAME=VALUE")),
    }
}

/// The admin API's tokens: one set of flags for the daemon (which checks
/// them) and every command that calls it (which sends one). The tokens
/// themselves come from the environment or a file, never from a flag that
/// `ps` would show.
#[derive(Debug, clap::Args)]
pub(crate) struct TokenArgs {
    /// Read the admin API's full-access token from FILE (instead of the
    /// SLUICE_ADMIN_TOKEN environment variable).
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Read the admin API's read-only token (status, topics, tail, DLQ list
    /// and show) from FILE (instead of SLUICE_ADMIN_READ_TOKEN).
    #[arg(long, value_name = "FILE")]
    admin_read_token_file: Option<PathBuf>,
}

/// A token and where it came from (for messages; the token itself is never
/// printed).
#[derive(Clone)]
pub(crate) struct TokenSource {
    /// The token.
    pub(crate) text: String,
    /// `SLUICE_ADMIN_TOKEN`, `--admin-token-file /path`, ...
    pub(crate) source: String,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSource(<redacted> from {})", self.source)
    }
}

/// The full-access token's environment variable.
pub(crate) const ADMIN_TOKEN_ENV: &str = "SLUICE_ADMIN_TOKEN";
/// The read-only token's environment variable.
pub(crate) const ADMIN_READ_TOKEN_ENV: &str = "SLUICE_ADMIN_READ_TOKEN";

impl TokenArgs {
    /// The full-access token: `--admin-token-file`, else
    /// `SLUICE_ADMIN_TOKEN`.
    pub(crate) fn full(&self) -> Result<Option<TokenSource>, String> {
        token(
            self.admin_token_file.as_deref(),
            "--admin-token-file",
            ADMIN_TOKEN_ENV,
        )
    }

    /// The read-only token: `--admin-read-token-file`, else
    /// `SLUICE_ADMIN_READ_TOKEN`.
    pub(crate) fn read(&self) -> Result<Option<TokenSource>, String> {
        token(
            self.admin_read_token_file.as_deref(),
            "--admin-read-token-file",
            ADMIN_READ_TOKEN_ENV,
        )
    }
}

/// A token from `file` if given, else from the environment variable `env`.
/// An empty file or variable is an error (a token that is silently absent
/// would leave the API open); an unset variable is no token.
fn token(
    file: Option<&std::path::Path>,
    flag: &str,
    env: &str,
) -> Result<Option<TokenSource>, String> {
    if let Some(file) = file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {flag} {}: {e}", file.display()))?;
        let text = text.trim();
        if text.is_empty() {
            return Err(format!("{flag} {} is empty", file.display()));
        }
        return Ok(Some(TokenSource {
            text: text.to_owned(),
            source: format!("{flag} {}", file.display()),
        }));
    }
    match std::env::var(env) {
        Ok(text) if text.trim().is_empty() => Err(format!(
            "{env} is set but empty; unset it or give the token"
        )),
        Ok(text) => Ok(Some(TokenSource {
            text: text.trim().to_owned(),
            source: env.to_owned(),
        })),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{env} is not valid UTF-8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spellings_users_write() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(byte_size("64MiB"), Ok(64 << 20));
        assert_eq!(byte_size("1000"), Ok(1000));
        assert_eq!(key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(duration("fast").is_err());
        assert!(byte_size("lots").is_err());
        assert!(key_value("=x").is_err());
        assert!(key_value("novalue").is_err());
    }
}
