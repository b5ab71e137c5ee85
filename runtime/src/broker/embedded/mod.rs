//! The embedded broker: durable topics in the daemon's data directory.
