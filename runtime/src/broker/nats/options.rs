//! async-nats's side of [`NatsOptions`] (parsed from the pipeline's
//! `broker:` URL in config): its connect options and server addresses.

use std::time::Duration;

use crate::config::NatsOptions;

impl NatsOptions {
    /// async-nats's connect options for these settings. Reconnects are
    /// unlimited: a daemon outlives broker restarts.
    pub(super) async fn connect_options(
        &self,
    ) -> Result<async_nats::ConnectOptions, std::io::Error> {
        let mut connect = async_nats::ConnectOptions::new()
            .name("sluice")
            .max_reconnects(None)
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(10)));
        if let Some((user, password)) = &self.user_password {
            connect = connect.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.token {
            connect = connect.token(token.clone());
        }
        if let Some(creds) = &self.creds {
            connect = connect.credentials_file(creds).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("creds file {}: {e}", creds.display()))
            })?;
        }
        if let Some(ca) = &self.tls_ca {
            connect = connect.add_root_certificates(ca.clone());
        }
        if self.require_tls {
            connect = connect.require_tls(true);
        }
        Ok(connect)
    }

    /// The servers as async-nats addresses.
    pub(super) fn server_addrs(&self) -> Result<Vec<async_nats::ServerAddr>, std::io::Error> {
        self.servers
            .iter()
            .map(|s| {
                s.parse::<async_nats::ServerAddr>().map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{s}: {e}"))
                })
            })
            .collect()
    }
}
