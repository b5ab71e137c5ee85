//! `GET /v1/state/{pipeline}/{stage}`: the keys of a stage's state store
//! and their sizes; `GET .../keys/{key}`: one value; `DELETE
//! .../keys/{key}`: an operator's delete ([`crate::state`]).
//!
//! Keys and sizes are for the read token too; values need the full
//! token, since they are the handler's data (a customer's balance, a
//! lock's holder). A delete is committed like a handler's: a call that
//! read the key meanwhile runs again.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::openapi::{StageErrors, StagePath};
use super::role::Role;
use super::{AdminState, ApiError};

/// The most entries one listing returns.
const MAX_LISTING: usize = 1000;

/// What a listing asks for.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// Only keys that start with this.
    #[serde(default)]
    prefix: Option<String>,
    /// Only keys after this one (the last key of the previous page).
    #[serde(default)]
    after: Option<String>,
    /// At most this many (default and most: 1,000).
    #[serde(default)]
    limit: Option<usize>,
}

/// `{pipeline}/{stage}/keys/{key}` in a path.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct KeyPath {
    /// A loaded pipeline.
    pipeline: String,
    /// One of its stages with `state:`.
    stage: String,
    /// The key.
    key: String,
}

/// One key of a listing: no value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StateKey {
    /// The key.
    pub key: String,
    /// Its key and value bytes, as they count against `max_bytes`.
    pub size: u64,
    /// The store's revision when it was written.
    pub revision: u64,
    /// When it expires (ms since the Unix epoch), if it does.
    pub expires_at: Option<u64>,
    /// When it was written (ms since the Unix epoch).
    pub written_at: u64,
    /// The id of the message whose call wrote it (empty: an operator).
    pub writer: String,
}

/// A page of a stage's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StateListing {
    /// The store, `<pipeline>/<store>` (stages naming one store share it).
    pub store: String,
    /// Its bytes (keys and values), expired ones not yet swept included.
    pub bytes: u64,
    /// Its keys, likewise.
    pub keys: u64,
    /// Its `max_bytes`.
    pub max_bytes: u64,
    /// Live keys, in order, after `after` and under `prefix`.
    pub entries: Vec<StateKey>,
    /// Whether more keys follow: ask again with `after` = the last key.
    pub more: bool,
}

/// One value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StateValue {
    /// The key, with its size and revision.
    #[serde(flatten)]
    pub key: StateKey,
    /// The value as text, when it is UTF-8.
    pub value: Option<String>,
    /// The value in base64, when it is not.
    pub value_base64: Option<String>,
}

/// What a delete answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StateDeleted {
    /// The key.
    pub key: String,
    /// Whether it was there.
    pub deleted: bool,
}

/// `GET /v1/state/{pipeline}/{stage}`.
#[utoipa::path(get, path = "/v1/state/{pipeline}/{stage}", operation_id = "list_state", tag = "state",
    description = "The keys of a stage's state store, in order, with their sizes, revisions and expiry (no values), and the store's totals.",
    params(StagePath, ListQuery),
    responses(
        (status = 200, description = "A page of keys.", body = StateListing),
        StageErrors,
    ))]
pub(super) async fn list(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<StateListing>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    Ok(Json(
        state
            .state_list(
                &pipeline,
                &stage,
                query.prefix.as_deref().unwrap_or(""),
                query.after.as_deref(),
                query.limit.unwrap_or(MAX_LISTING),
            )
            .await?,
    ))
}

/// `GET /v1/state/{pipeline}/{stage}/keys/{key}`.
#[utoipa::path(get, path = "/v1/state/{pipeline}/{stage}/keys/{key}", operation_id = "get_state", tag = "state",
    description = "One value of a stage's state store. Needs the full token: values are the handler's data.",
    params(KeyPath),
    responses(
        (status = 200, description = "The value.", body = StateValue),
        (status = 403, description = "The read token sees keys and sizes, not values.", body = super::ErrorBody),
        StageErrors,
    ))]
pub(super) async fn get(
    State(state): State<AdminState>,
    role: Option<axum::Extension<Role>>,
    path: Result<Path<KeyPath>, PathRejection>,
) -> Result<Json<StateValue>, ApiError> {
    let Path(KeyPath {
        pipeline,
        stage,
        key,
    }) = path?;
    if matches!(role, Some(axum::Extension(Role::Read))) {
        return Err(ApiError::Forbidden(
            "the read token sees a state store's keys and sizes, not its values; use the full \
             token"
                .into(),
        ));
    }
    Ok(Json(state.state_get(&pipeline, &stage, &key).await?))
}

/// `DELETE /v1/state/{pipeline}/{stage}/keys/{key}`.
#[utoipa::path(delete, path = "/v1/state/{pipeline}/{stage}/keys/{key}", operation_id = "delete_state", tag = "state",
    description = "Deletes one key of a stage's state store, committed as a handler's delete would be: a call that read the key meanwhile runs again.",
    params(KeyPath),
    responses(
        (status = 200, description = "Whether it was there.", body = StateDeleted),
        StageErrors,
    ))]
pub(super) async fn delete(
    State(state): State<AdminState>,
    path: Result<Path<KeyPath>, PathRejection>,
) -> Result<Json<StateDeleted>, ApiError> {
    let Path(KeyPath {
        pipeline,
        stage,
        key,
    }) = path?;
    let (store, _) = state.state_store(&pipeline, &stage)?;
    let deleted = state.broker().delete_state(&store, &key).await?;
    tracing::warn!(store, key, deleted, "state key deleted by the operator");
    Ok(Json(StateDeleted { key, deleted }))
}

fn key_view(key: &str, entry: &crate::state::Entry) -> StateKey {
    StateKey {
        key: key.to_owned(),
        size: entry.size(key),
        revision: entry.revision,
        expires_at: (entry.expires_at != 0).then_some(entry.expires_at),
        written_at: entry.written_at,
        writer: entry.writer.clone(),
    }
}

impl AdminState {
    /// The store a stage's `state:` names, with its `max_bytes`.
    ///
    /// # Errors
    ///
    /// No loaded pipeline has that stage, or it has no `state:`.
    pub fn state_store(&self, pipeline: &str, stage: &str) -> Result<(String, u64), ApiError> {
        let catalog = self.catalog();
        let declared = catalog
            .pipelines
            .iter()
            .find(|p| p.name == pipeline)
            .and_then(|p| p.stages.iter().find(|s| s.name == stage))
            .ok_or_else(|| ApiError::UnknownStage(format!("{pipeline}/{stage}")))?;
        declared.state_store(pipeline).ok_or_else(|| {
            ApiError::NotFound(format!(
                "stage {pipeline}/{stage} keeps no state (its YAML has no `state:`)"
            ))
        })
    }

    fn state_reader(&self) -> Result<std::sync::Arc<dyn crate::state::StateReader>, ApiError> {
        self.broker().state().ok_or_else(|| {
            ApiError::NotFound("this broker keeps no handler state (the embedded one does)".into())
        })
    }

    /// What `GET /v1/state/{pipeline}/{stage}` answers.
    ///
    /// # Errors
    ///
    /// The stage is unknown or keeps no state, or the store cannot be read.
    pub async fn state_list(
        &self,
        pipeline: &str,
        stage: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<StateListing, ApiError> {
        let (store, max_bytes) = self.state_store(pipeline, stage)?;
        let reader = self.state_reader()?;
        let unreadable = |e: String| ApiError::Unavailable(format!("state store {store}: {e}"));
        let meta = reader.meta(&store).await.map_err(unreadable)?;
        let limit = limit.clamp(1, MAX_LISTING);
        let now = crate::broker::now_millis();
        let mut entries = Vec::new();
        let mut cursor = after.map(str::to_owned);
        let mut more = false;
        // Expired keys not yet swept are skipped, page by page.
        'pages: loop {
            let page = reader
                .list(&store, prefix, cursor.as_deref(), limit + 1)
                .await
                .map_err(unreadable)?;
            let full = page.len() > limit;
            for (key, entry) in &page {
                cursor = Some(key.clone());
                if entry.expired(now) {
                    continue;
                }
                if entries.len() == limit {
                    more = true;
                    break 'pages;
                }
                entries.push(key_view(key, entry));
            }
            if !full {
                break;
            }
        }
        Ok(StateListing {
            store,
            bytes: meta.bytes,
            keys: meta.keys,
            max_bytes,
            entries,
            more,
        })
    }

    /// What `GET /v1/state/{pipeline}/{stage}/keys/{key}` answers.
    ///
    /// # Errors
    ///
    /// The stage is unknown or keeps no state, the key is absent or
    /// expired, or the store cannot be read.
    pub async fn state_get(
        &self,
        pipeline: &str,
        stage: &str,
        key: &str,
    ) -> Result<StateValue, ApiError> {
        let (store, _) = self.state_store(pipeline, stage)?;
        let reader = self.state_reader()?;
        let entry = reader
            .get(&store, key)
            .await
            .map_err(|e| ApiError::Unavailable(format!("state store {store}: {e}")))?
            .filter(|e| !e.expired(crate::broker::now_millis()))
            .ok_or_else(|| ApiError::NotFound(format!("no key `{key}` in state store {store}")))?;
        let (value, value_base64) = match std::str::from_utf8(&entry.value) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&entry.value)),
            ),
        };
        Ok(StateValue {
            key: key_view(key, &entry),
            value,
            value_base64,
        })
    }
}
