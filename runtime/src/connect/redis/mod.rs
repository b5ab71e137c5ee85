//! Redis Streams: a source (a consumer group, `XREADGROUP`, `XACK` after
//! the durable publish, `XAUTOCLAIM` of a dead reader's entries) and a
//! sink (`XADD`, made effectively-once by a dedup key set in the same
//! script).

mod config;

pub use config::{RedisSinkConfig, RedisSourceConfig, StartFrom};
