//! TLS for the connectors: the crate's one way to do it ([`crate::tls`]),
//! re-exported at the path the connectors name.

pub use crate::tls::{
    Identity, TlsFiles, TlsOptions, check_ca, client_config, install_default_provider,
    is_trust_error, read_pem, read_roots, resolve_all, resolve_ca, trust_hint,
};
