//! `GET /v1/stages/{pipeline}/{stage}`: a stage's config as loaded and its
//! last 15 minutes (`history.rs`), for the console's stage view; and
//! `POST /v1/stages/{pipeline}/{stage}/pause` and `/resume`: the
//! operator's hold on a stage.
//!
//! A paused stage fetches nothing. Calls already in flight finish and
//! settle (their leases stay valid), so pausing never loses or repeats
//! work. The pause lives in the broker ([`crate::broker::Broker::set_paused`]):
//! it survives restarts, and on NATS it holds for every daemon. `status`
//! shows it. Both calls are idempotent and answer the state after them.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use super::openapi::{StageErrors, StagePath};
use super::{AdminState, ApiError};
use crate::broker::BrokerError;

/// What a pause or resume answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageControl {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// Whether it is paused now.
    pub paused: bool,
}

/// A stage as the console's stage view shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageDetail {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// `plugin`, `sink:<connector>` or `source`.
    pub kind: String,
    /// Its section of the pipeline file as loaded (defaults filled in,
    /// `${VAR}` expanded, secrets shown as `***`).
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    /// The state store its handler keeps (`<pipeline>/<store>`), when its
    /// YAML has `state:`; its keys are at `GET /v1/state/{pipeline}/{stage}`.
    #[serde(default)]
    pub state_store: Option<String>,
    /// Its last 15 minutes, a point every 10 s.
    pub history: super::history::StageHistory,
}

/// `GET /v1/stages/{pipeline}/{stage}`.
#[utoipa::path(get, path = "/v1/stages/{pipeline}/{stage}", operation_id = "get_stage", tag = "stages",
    description = "A stage's config as loaded, the state store it keeps (`state_store`, null when none) and its last 15 minutes: throughput, handler latency p50/p99 and deliveries by outcome, a point every 10 s.",
    params(StagePath),
    responses(
        (status = 200, description = "The stage.", body = StageDetail),
        StageErrors,
    ))]
pub(super) async fn detail(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
) -> Result<Json<StageDetail>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    Ok(Json(state.stage_detail(&pipeline, &stage)?))
}

/// `POST /v1/stages/{pipeline}/{stage}/pause`.
#[utoipa::path(post, path = "/v1/stages/{pipeline}/{stage}/pause", operation_id = "pause_stage", tag = "stages",
    description = "Holds the stage: it fetches nothing until resumed; calls in flight finish. Kept by the broker across restarts and daemons. Idempotent.",
    params(StagePath),
    responses(
        (status = 200, description = "The stage's state after the call.", body = StageControl),
        StageErrors,
    ))]
pub(super) async fn pause(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
) -> Result<Json<StageControl>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    Ok(Json(state.set_paused(&pipeline, &stage, true).await?))
}

/// `POST /v1/stages/{pipeline}/{stage}/resume`.
#[utoipa::path(post, path = "/v1/stages/{pipeline}/{stage}/resume", operation_id = "resume_stage", tag = "stages",
    description = "Lets a paused stage fetch again. Idempotent.",
    params(StagePath),
    responses(
        (status = 200, description = "The stage's state after the call.", body = StageControl),
        StageErrors,
    ))]
pub(super) async fn resume(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
) -> Result<Json<StageControl>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    Ok(Json(state.set_paused(&pipeline, &stage, false).await?))
}

impl AdminState {
    /// What `GET /v1/stages/{pipeline}/{stage}` answers.
    ///
    /// # Errors
    ///
    /// No loaded pipeline has that stage or source.
    pub fn stage_detail(&self, pipeline: &str, stage: &str) -> Result<StageDetail, ApiError> {
        let catalog = self.catalog();
        let unknown = || ApiError::UnknownStage(format!("{pipeline}/{stage}"));
        let declared = catalog
            .pipelines
            .iter()
            .find(|p| p.name == pipeline)
            .ok_or_else(unknown)?;
        // A config that parsed always serialises; should one ever not,
        // the view says so instead of failing the whole stage.
        let to_json = |value: Result<serde_json::Value, serde_json::Error>| {
            Ok::<_, ApiError>(value.unwrap_or_else(|err| {
                serde_json::Value::String(format!("(cannot show the config: {err})"))
            }))
        };
        if let Some(index) = catalog
            .stages
            .iter()
            .position(|s| s.pipeline == pipeline && s.stage == stage)
        {
            let config = declared
                .stages
                .iter()
                .find(|s| s.name == stage)
                .ok_or_else(unknown)?;
            return Ok(StageDetail {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
                kind: catalog.stages[index].kind.clone(),
                config: to_json(serde_json::to_value(config))?,
                state_store: config.state_store(pipeline).map(|(store, _)| store),
                history: catalog.history.snapshot(index),
            });
        }
        let source = declared
            .sources
            .iter()
            .find(|s| s.name == stage)
            .ok_or_else(unknown)?;
        Ok(StageDetail {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
            kind: "source".into(),
            config: to_json(serde_json::to_value(source))?,
            state_store: None,
            history: super::history::StageHistory {
                interval_seconds: super::history::INTERVAL.as_secs(),
                points: Vec::new(),
            },
        })
    }

    /// Pauses or resumes a stage: what `POST .../pause` and `.../resume`
    /// do.
    ///
    /// # Errors
    ///
    /// The stage is unknown or is a source (a source reads no topic), the
    /// stage has not started yet, or the broker failed.
    pub async fn set_paused(
        &self,
        pipeline: &str,
        stage: &str,
        paused: bool,
    ) -> Result<StageControl, ApiError> {
        let entry = self.stage(pipeline, stage).await?;
        if entry.kind == "source" {
            return Err(ApiError::BadRequest(format!(
                "{pipeline}/{stage} is a source; only stages that read a topic can be paused"
            )));
        }
        // Every lane of a stage with several topics: a pause holds them all.
        for input in &entry.inputs {
            match self.broker().set_paused(&input.consumer, paused).await {
                Ok(()) => {}
                Err(BrokerError::UnknownConsumer(_)) => {
                    // Without its pipeline, a stage is taken to read one
                    // topic; a stage with lanes has a consumer per lane.
                    let lanes = if entry.inputs.iter().all(|i| i.topic.is_empty()) {
                        "; a stage with several topics (priority lanes) has one per lane, \
                         `P.S~TOPIC`: pass --pipelines so they are known"
                    } else {
                        ""
                    };
                    return Err(ApiError::UnknownStage(format!(
                        "{pipeline}/{stage} (no consumer `{}` on the broker: has it ever run?{lanes})",
                        input.consumer
                    )));
                }
                Err(err) => return Err(err.into()),
            }
        }
        tracing::warn!(
            "stage {pipeline}/{stage} {} by the operator",
            if paused { "paused" } else { "resumed" }
        );
        Ok(StageControl {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
            paused,
        })
    }
}
