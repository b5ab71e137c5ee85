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
