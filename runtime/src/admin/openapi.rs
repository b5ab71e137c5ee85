//! `GET /v1/openapi.json`: the admin API described as OpenAPI 3.1, so
//! producers in any language can generate a client.
//!
//! The document is built from the code: each handler carries its own
//! `#[utoipa::path]` (parameters, bodies, every status it answers), each
//! type it takes or answers derives `ToSchema`, and [`super::router`]
//! registers routes through `utoipa-axum`, which adds a route and its
//! description in one call. What the access guard adds to every route
//! (`access.rs`: the bearer token, its 401 and 403, the `Host` check's 421)
//! is added here once, by [`Guarded`], rather than on each handler.
//!
//! `sluice openapi` prints the same document without a daemon.

use utoipa::Modify;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr};

use super::ErrorBody;

/// The security scheme's name in the document.
const TOKEN: &str = "token";

/// The document's fixed parts; the paths come from the router.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Sluice admin API",
        description = "Ingest, topic reads, status, dead-letter tools, stage control and hot \
            reload of a Sluice daemon. With a token configured, every `/v1` call needs \
            `Authorization: Bearer <token>`; the read-only token may only GET. Errors are \
            `{\"error\", \"code\"}` with a stable `code`.",
    ),
    components(schemas(ErrorBody)),
    tags(
        (name = "health", description = "Probes and metrics: open without a token."),
        (name = "ingest", description = "Publishing into a pipeline's topics."),
        (name = "topics", description = "Reading topics without consuming them."),
        (name = "status", description = "What every stage and source is doing."),
        (name = "dlq", description = "Dead letters: list, show, redrive, purge."),
        (name = "stages", description = "The operator's hold on a stage."),
        (name = "state", description = "The handler state stores of stages with `state:`: keys, values, deletes."),
        (name = "reload", description = "Hot reload of the pipeline files and plugins."),
        (name = "console", description = "The web console's sign-in: a token for a session cookie."),
    ),
    modifiers(&Guarded)
)]
pub(super) struct ApiDoc;

/// `{pipeline}/{stage}` in a path: what the stage and DLQ routes address.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct StagePath {
    /// A loaded pipeline.
    pub(super) pipeline: String,
    /// One of its stages (a sink is a stage).
    pub(super) stage: String,
}

/// How an operation on a `{pipeline}/{stage}` fails, besides its own
/// cases: described once here, listed in each one's `responses(...)`.
#[derive(utoipa::IntoResponses)]
#[expect(
    dead_code,
    reason = "a description of responses; the handlers answer with ApiError"
)]
pub(super) enum StageErrors {
    /// The path or the request is not valid (the message says what).
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No loaded pipeline has this stage (or it has never run).
    #[response(status = 404)]
    UnknownStage(ErrorBody),
    /// The broker cannot answer now; retry after `Retry-After` seconds.
    #[response(status = 503, headers(("Retry-After" = u32)))]
    Unavailable(ErrorBody),
}

/// How a JSON request body can be refused.
#[derive(utoipa::IntoResponses)]
#[expect(
    dead_code,
    reason = "a description of responses; the handlers answer with ApiError"
)]
pub(super) enum BodyErrors {
    /// The body is over 64 KiB.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// The body is not `application/json`.
    #[response(status = 415)]
    NotJson(ErrorBody),
}

/// Adds what the access guard does to every `/v1` operation: the bearer
/// token, 401 without it, 421 for a `Host` that names another server,
/// and, on writes, 403 for the read-only token or a cross-site `Origin`.
struct Guarded;

impl Modify for Guarded {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "SLUICE_ADMIN_TOKEN (full access) or SLUICE_ADMIN_READ_TOKEN (GET only). \
                         Without either configured the API is open. An address (other than \
                         loopback) that presents 10 wrong tokens within 60 s is refused with \
                         429 `too_many_auth_failures` and a Retry-After for 300 s, whatever it sends.",
                    ))
                    .build(),
            ),
        );
        for (name, description) in [
            (
                "Unauthorized",
                "A token is configured and the request has none, or a wrong one \
                 (`WWW-Authenticate: Bearer`).",
            ),
            (
                "Forbidden",
                "The read-only token may not change anything, or the request came from a \
                 web page of another site (`Origin`).",
            ),
            (
                "MisdirectedHost",
                "`Host` names neither this server, `localhost`, nor an `--admin-allowed-host` \
                 (DNS rebinding).",
            ),
        ] {
            components
                .responses
                .insert(name.to_owned(), RefOr::T(error_response(description)));
        }
    }
}

/// `GET /v1/openapi.json`.
#[utoipa::path(
    get,
    path = "/v1/openapi.json", operation_id = "openapi",
    tag = "status",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object)),
)]
pub(super) async fn openapi_json() -> impl axum::response::IntoResponse {
    /// Built once: the document is fixed for the life of the binary.
    static JSON: std::sync::OnceLock<bytes::Bytes> = std::sync::OnceLock::new();
    let json = JSON.get_or_init(|| {
        serde_json::to_vec(&document())
            .expect("the OpenAPI document serialises")
            .into()
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json.clone(),
    )
}

/// Where the guard's responses go; called on the finished document, once
/// the router has added the paths ([`document`]).
fn guard_operations(openapi: &mut OpenApi) {
    for (path, item) in &mut openapi.paths.paths {
        if !path.starts_with("/v1/") {
            continue;
        }
        let reads = [item.get.as_mut()];
        let writes = [item.post.as_mut(), item.put.as_mut(), item.delete.as_mut()];
        for operation in reads.into_iter().flatten() {
            guard(operation, false);
        }
        for operation in writes.into_iter().flatten() {
            guard(operation, true);
        }
    }
}

fn guard(operation: &mut Operation, writes: bool) {
    operation
        .security
        .get_or_insert_with(Vec::new)
        .push(SecurityRequirement::new(TOKEN, Vec::<String>::new()));
    let responses = &mut operation.responses.responses;
    let mut add = |status: &str, name: &str| {
        responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))));
    };
    add("401", "Unauthorized");
    add("421", "MisdirectedHost");
    if writes {
        add("403", "Forbidden");
    }
}

/// A response whose body is an [`ErrorBody`].
pub(super) fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

/// The whole document: the fixed parts above, the router's paths and
/// their schemas, and the guard's responses.
pub fn document() -> OpenApi {
    let (_, mut openapi) = super::routes().split_for_parts();
    guard_operations(&mut openapi);
    openapi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_and_every_reference_resolves() {
        let doc = serde_json::to_value(document()).expect("the document serialises");
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().expect("paths");
        for path in [
            "/health",
            "/health/ready",
            "/metrics",
            "/v1/status",
            "/v1/topics/{topic}/messages",
            "/v1/topics/{topic}/batch",
            "/v1/dlq/{pipeline}/{stage}/redrive",
            "/v1/stages/{pipeline}/{stage}/pause",
            "/v1/reload",
            "/v1/openapi.json",
            "/ui/session",
        ] {
            assert!(paths.contains_key(path), "{path} is not in the document");
        }
        // Both methods of a shared path are there.
        let messages = &paths["/v1/topics/{topic}/messages"];
        assert!(messages["get"].is_object() && messages["post"].is_object());
        // Writes carry the guard's 403; reads do not; probes need no token.
        let redrive = &paths["/v1/dlq/{pipeline}/{stage}/redrive"]["post"];
        assert!(redrive["responses"]["403"].is_object());
        assert!(redrive["security"].is_array());
        assert!(paths["/v1/status"]["get"]["responses"]["403"].is_null());
        assert!(paths["/health"]["get"]["security"].is_null());
        // The console's sign-in takes no bearer token: it is how one is used.
        let session = &paths["/ui/session"];
        assert!(session["get"].is_object() && session["delete"].is_object());
        assert!(session["post"]["security"].is_null());
        // Operation ids name the methods of generated clients: one each,
        // none twice.
        let mut ids: Vec<&str> = paths
            .values()
            .flat_map(|item| item.as_object().into_iter().flat_map(|m| m.values()))
            .filter_map(|operation| operation["operationId"].as_str())
            .collect();
        let count = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), count, "an operationId is used twice: {ids:?}");
        // Every `$ref` names something the document defines.
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for reference in refs {
            let pointer = reference.trim_start_matches('#');
            assert!(
                doc.pointer(pointer).is_some(),
                "{reference} does not resolve"
            );
        }
    }

    fn collect_refs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("$ref", serde_json::Value::String(target)) => out.push(target.clone()),
                        _ => collect_refs(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }
}
