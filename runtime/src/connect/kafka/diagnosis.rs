//! What is wrong with a Kafka client's connection, in words an operator
//! can act on.
//!
//! librdkafka reports a refused TLS handshake, a wrong password or a
//! missing ACL through its error callback and its poll errors, in its own
//! words, and then, for a producer, only "Message timed out" once the
//! delivery timeout passes. [`Diagnosis`] keeps the last such cause of a
//! client, said plainly (what is wrong, and what to set), so the source's
//! and the sink's outage reason names it, not the symptom. A specific
//! cause (TLS, authentication, authorization) is not replaced by the
//! generic "all brokers are down" that follows it, and each new cause is
//! logged once.

use std::sync::{Mutex, PoisonError};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::config::Sasl;
use super::scrub;

/// What kind of trouble a client has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The broker's certificate is not trusted.
    Untrusted,
    /// The broker refused this client's certificate, or wants one.
    ClientCertificate,
    /// Another TLS failure.
    Tls,
    /// SASL authentication failed: the user name or the password.
    Authentication,
    /// An ACL does not allow this on the topic.
    TopicAuthorization,
    /// An ACL does not allow this on the consumer group.
    GroupAuthorization,
    /// An ACL does not allow this on the cluster (the idempotent
    /// producer needs `IdempotentWrite` on Kafka before 3.0).
    ClusterAuthorization,
    /// The brokers cannot be reached or a request timed out.
    Unreachable,
}

impl Cause {
    /// Whether this says more than "cannot reach the brokers".
    fn specific(self) -> bool {
        self != Cause::Unreachable
    }
}

/// The cause of `code` with librdkafka's `text`, if it is a connection
/// trouble at all.
pub(crate) fn cause_of(code: RDKafkaErrorCode, text: &str) -> Option<Cause> {
    use RDKafkaErrorCode as C;
    let lower = text.to_ascii_lowercase();
    let cause = match code {
        C::SSL => {
            if lower.contains("certificate verify failed")
                || lower.contains("could not be verified")
            {
                Cause::Untrusted
            } else if lower.contains("alert")
                && (lower.contains("certificate") || lower.contains("handshake failure"))
            {
                Cause::ClientCertificate
            } else {
                Cause::Tls
            }
        }
        C::Authentication | C::SaslAuthenticationFailed => Cause::Authentication,
        C::TopicAuthorizationFailed => Cause::TopicAuthorization,
        C::GroupAuthorizationFailed => Cause::GroupAuthorization,
        C::ClusterAuthorizationFailed | C::TransactionalIdAuthorizationFailed => {
            Cause::ClusterAuthorization
        }
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::MessageTimedOut
        | C::OperationTimedOut
        | C::RequestTimedOut
        | C::NetworkException => Cause::Unreachable,
        _ => return None,
    };
    Some(cause)
}

/// What to do about `cause`, for a client of `user` (SASL) on
/// `what` (`topic \`in\``, ...).
fn advice(cause: Cause, user: Option<&str>, role: Role) -> String {
    let who = user.map_or_else(|| "this client".to_owned(), |u| format!("user `{u}`"));
    match cause {
        Cause::Untrusted => "the broker's TLS certificate is not trusted: give its CA in \
                             `tls_ca`, or fix the broker's certificate"
            .to_owned(),
        Cause::ClientCertificate => "the broker refused this client's TLS certificate, or \
                                     wants one: give a certificate it accepts as `tls_cert`, \
                                     with its key as `tls_key`"
            .to_owned(),
        Cause::Tls => "the TLS handshake with the broker failed: check `security`, `tls_ca`, \
                       `tls_cert` and `tls_key` against the broker's listener"
            .to_owned(),
        Cause::Authentication => format!(
            "SASL authentication failed for {who}: check `sasl.username`, `sasl.password` and \
             `sasl.mechanism` against the broker's users"
        ),
        Cause::TopicAuthorization => format!(
            "{who} is not authorized for the topic: grant it an ACL ({})",
            role.topic_operations()
        ),
        Cause::GroupAuthorization => format!(
            "{who} is not authorized for the consumer group: grant it an ACL (Read on the group)"
        ),
        Cause::ClusterAuthorization => format!(
            "{who} is not authorized on the cluster: grant it an ACL (IdempotentWrite on the \
             cluster, which the idempotent producer needs on brokers before Kafka 3.0)"
        ),
        Cause::Unreachable => "cannot reach the brokers".to_owned(),
    }
}

/// Which end a client is, for the ACLs it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A consumer (the source).
    Consumer,
    /// A producer (the sink).
    Producer,
}

impl Role {
    fn topic_operations(self) -> &'static str {
        match self {
            Role::Consumer => "Read and Describe on the topic",
            Role::Producer => "Write and Describe on the topic",
        }
    }
}

/// The last connection trouble of one client.
pub(crate) struct Diagnosis {
    role: Role,
    label: String,
    sasl: Option<Sasl>,
    last: Mutex<Option<(Cause, String)>>,
}

impl Diagnosis {
    /// No trouble yet, for a client labelled `label` (for the log).
    pub(crate) fn new(role: Role, label: String, sasl: Option<Sasl>) -> Self {
        Diagnosis {
            role,
            label,
            sasl,
            last: Mutex::new(None),
        }
    }

    /// Notes `err` (from the error callback or a poll), if it is a
    /// connection trouble; returns the explanation now held. A specific
    /// cause is logged once when it begins.
    pub(crate) fn note(&self, err: &KafkaError, reason: &str) -> Option<String> {
        let code = err.rdkafka_error_code()?;
        let raw = if reason.is_empty() {
            err.to_string()
        } else {
            format!("{err}: {reason}")
        };
        self.note_code(code, &raw)
    }

    /// [`note`](Self::note) with the code and librdkafka's text.
    pub(crate) fn note_code(&self, code: RDKafkaErrorCode, raw: &str) -> Option<String> {
        let cause = cause_of(code, raw)?;
        let raw = scrub(self.sasl.as_ref(), raw);
        let user = self.sasl.as_ref().map(|s| s.username.as_str());
        let said = format!("{} ({raw})", advice(cause, user, self.role));
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = matches!(&*last, Some((held, _)) if held.specific() && !cause.specific());
        if keep {
            return last.as_ref().map(|(_, s)| s.clone());
        }
        if cause.specific() && last.as_ref().map(|(c, _)| *c) != Some(cause) {
            tracing::warn!(client = %self.label, error = %said, "kafka refuses this client");
        }
        *last = Some((cause, said.clone()));
        Some(said)
    }

    /// The trouble held, if a specific one: what to say instead of a
    /// bare timeout.
    pub(crate) fn specific(&self) -> Option<String> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.as_ref()
            .filter(|(cause, _)| cause.specific())
            .map(|(_, said)| said.clone())
    }

    /// The client got through: the trouble is over.
    pub(crate) fn clear(&self) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((cause, _)) = last.take()
            && cause.specific()
        {
            tracing::info!(client = %self.label, "kafka takes this client again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::Secret;

    fn sasl() -> Sasl {
        Sasl {
            mechanism: super::super::SaslMechanism::ScramSha512,
            username: "alice".into(),
            password: Secret::from("hunter2"),
        }
    }

    #[test]
    fn librdkafkas_words_become_what_to_do() {
        let d = Diagnosis::new(Role::Consumer, "p/src".into(), Some(sasl()));
        let said = d
            .note_code(
                RDKafkaErrorCode::SSL,
                "ssl://127.0.0.1:1/bootstrap: SSL handshake failed: error:0A000086:SSL \
                 routines::certificate verify failed: broker certificate could not be verified",
            )
            .expect("a trouble");
        assert!(
            said.contains("not trusted") && said.contains("tls_ca"),
            "{said}"
        );
        let said = d
            .note_code(
                RDKafkaErrorCode::Authentication,
                "SASL authentication error: Authentication failed during authentication due to \
                 invalid credentials with SASL mechanism SCRAM-SHA-512 (password hunter2)",
            )
            .expect("a trouble");
        assert!(
            said.contains("user `alice`") && said.contains("sasl.password"),
            "{said}"
        );
        assert!(!said.contains("hunter2"), "{said}");
        let said = d
            .note_code(
                RDKafkaErrorCode::TopicAuthorizationFailed,
                "Broker: Topic authorization failed",
            )
            .expect("a trouble");
        assert!(said.contains("Read and Describe"), "{said}");
        assert_eq!(d.note_code(RDKafkaErrorCode::InvalidMessage, "x"), None);
    }

    #[test]
    fn a_specific_cause_outlives_the_generic_one_that_follows_it() {
        let d = Diagnosis::new(Role::Producer, "p/out".into(), None);
        d.note_code(
            RDKafkaErrorCode::SSL,
            "SSL handshake failed: certificate verify failed",
        );
        let said = d
            .note_code(RDKafkaErrorCode::AllBrokersDown, "1/1 brokers are down")
            .expect("a trouble");
        assert!(said.contains("not trusted"), "{said}");
        assert!(d.specific().is_some());
        d.clear();
        assert!(d.specific().is_none());
        let said = d
            .note_code(RDKafkaErrorCode::AllBrokersDown, "1/1 brokers are down")
            .expect("a trouble");
        assert!(said.contains("cannot reach the brokers"), "{said}");
        assert!(d.specific().is_none());
    }
}
