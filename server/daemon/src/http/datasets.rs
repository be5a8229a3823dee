//! `/v1/datasets`: create (indexed in the background), list, get, failures, re-index, append,
//! preload, delete.

use actix_web::{HttpResponse, delete, get, post, web};
use joader_storage::SourceSpec;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::error::errors;
use super::views::{DatasetList, DatasetView, Failure, FailureList, dataset_view};
use crate::error::{Error, Result};
use crate::registry::preload::{self, PreloadRequest};
use crate::registry::{append, datasets};
use crate::state::AppState;

/// `POST /v1/datasets`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "name": "imagenet",
    "source": {"kind": "image_folder", "path": "/data/imagenet/train"}
}))]
pub struct CreateDataset {
    /// 1 to 64 characters from `A-Z a-z 0-9 _ - .`, not starting with `.`.
    pub name: String,
    pub source: SourceSpec,
}

// Every route may also answer `internal` and, with a token, `unauthorized` (`super::openapi`).
errors!(CreateErrors: InvalidRequest, PathNotAllowed, EndpointNotAllowed, DatasetExists, ShuttingDown);
errors!(GetErrors: DatasetNotFound);
errors!(DeleteErrors: InvalidRequest, DatasetNotFound, DatasetInUse);
errors!(AppendErrors: InvalidRequest, PathNotAllowed, DatasetNotFound, DatasetNotReady, CannotAppend, ShuttingDown);
errors!(ReindexErrors: InvalidRequest, DatasetNotFound, DatasetInUse, DatasetNotReady, ShuttingDown);
errors!(PreloadErrors: InvalidRequest, EmptySubset, DatasetNotFound, DatasetNotReady, PreloadExists, PinBudget, ShuttingDown);
errors!(ReleaseErrors: DatasetNotFound, PreloadNotFound);

/// Create a dataset; indexing runs in the background (poll the dataset until its state is
/// `ready`).
#[utoipa::path(
    tag = "datasets",
    request_body = CreateDataset,
    responses(
        (status = 202, description = "accepted: state `indexing`", body = DatasetView),
        CreateErrors
    )
)]
#[post("/v1/datasets")]
async fn create_dataset(
    state: web::Data<AppState>,
    body: web::Json<CreateDataset>,
) -> Result<HttpResponse> {
    let CreateDataset { name, source } = body.into_inner();
    let st = state.registry.clone();
    let created = name.clone();
    // Persisting is a redb commit: on the blocking pool, never on the HTTP worker.
    web::block(move || datasets::create_dataset(&st, created, source))
        .await
        .map_err(Error::internal)??;
    let d = state.registry.dataset(&name)?;
    Ok(HttpResponse::Accepted().json(dataset_view(&d)))
}

/// List the datasets.
#[utoipa::path(
    tag = "datasets",
    responses((status = 200, description = "the datasets", body = DatasetList))
)]
#[get("/v1/datasets")]
async fn list_datasets(state: web::Data<AppState>) -> Result<HttpResponse> {
    let datasets = state.registry.datasets().iter().map(dataset_view).collect();
    Ok(HttpResponse::Ok().json(DatasetList { datasets }))
}

/// A dataset: its state (`indexing`, `ready`, `failed`), progress, items and classes.
#[utoipa::path(
    tag = "datasets",
    params(("name" = String, Path, description = "the dataset's name", example = "example")),
    responses((status = 200, description = "the dataset", body = DatasetView), GetErrors)
)]
#[get("/v1/datasets/{name}")]
async fn get_dataset(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse> {
    let d = state.registry.dataset(&name)?;
    Ok(HttpResponse::Ok().json(dataset_view(&d)))
}

/// The elements that failed to read or decode.
#[utoipa::path(
    tag = "datasets",
    params(("name" = String, Path, description = "the dataset's name", example = "example")),
    responses((status = 200, description = "its failed elements", body = FailureList), GetErrors)
)]
#[get("/v1/datasets/{name}/failures")]
async fn dataset_failures(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse> {
    let failures = datasets::failures(&state.registry, &name)?
        .into_iter()
        .map(|(element, kind, message)| Failure {
            element,
            kind,
            message,
        })
        .collect();
    Ok(HttpResponse::Ok().json(FailureList { failures }))
}

/// Index an `s3` dataset again, in the background (refused while jobs use it). Once its
/// state is `ready` again, its `changes` list the objects added, removed and changed (another
/// size or ETag) since the previous index; its element ids may differ.
#[utoipa::path(
    tag = "datasets",
    params(("name" = String, Path, description = "the dataset's name", example = "example")),
    responses(
        (status = 202, description = "accepted: state `indexing`", body = DatasetView),
        ReindexErrors
    )
)]
#[post("/v1/datasets/{name}/reindex")]
async fn reindex_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse> {
    let name = name.into_inner();
    let st = state.registry.clone();
    let owned = name.clone();
    // A catalog commit: on the blocking pool, never on the HTTP worker.
    web::block(move || datasets::reindex_dataset(&st, &owned))
        .await
        .map_err(Error::internal)??;
    let d = state.registry.dataset(&name)?;
    Ok(HttpResponse::Accepted().json(dataset_view(&d)))
}

/// `POST /v1/datasets/{name}/append`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"paths": ["/data/laion/shards-000147.tar"]}))]
pub struct AppendRequest {
    /// What joins the dataset, read as its source reads its own paths: `tar_shards`: shard
    /// files, folders of them or patterns; `parquet`: Parquet files, folders or patterns (with
    /// a `split`: dataset folders); `manifest`: manifest files of the dataset's format;
    /// `image_folder`: folders of class folders.
    #[schema(value_type = Vec<String>)]
    pub paths: Vec<std::path::PathBuf>,
}

/// What an append did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AppendView {
    /// Items appended: their ids follow the dataset's.
    pub added: u64,
    /// The running jobs that follow the dataset, each with the first epoch that covers the new
    /// items (the next one the server starts for it).
    pub jobs: Vec<GrownJob>,
    pub dataset: DatasetView,
}

/// A running job that follows its dataset as it grows.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GrownJob {
    pub name: String,
    pub from_epoch: u32,
}

/// Append shards, Parquet files, manifest files or class folders to a ready local dataset,
/// while its jobs run: the existing ids, labels and cached elements stay and the new items
/// take the next ids. Each running job of one rank registered without `subset` or `replay`
/// covers them from its next epoch (each epoch a permutation of the dataset as it stands when
/// the epoch starts); other jobs keep the dataset they registered with. Answers once the
/// appended paths are indexed and persisted.
#[utoipa::path(
    tag = "datasets",
    params(("name" = String, Path, description = "the dataset's name", example = "example")),
    request_body = AppendRequest,
    responses(
        (status = 200, description = "appended", body = AppendView),
        AppendErrors
    )
)]
#[post("/v1/datasets/{name}/append")]
async fn append_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<AppendRequest>,
) -> Result<HttpResponse> {
    let out = append::append_dataset(&state.registry, &name, body.into_inner().paths).await?;
    let d = state.registry.dataset(&name)?;
    Ok(HttpResponse::Ok().json(AppendView {
        added: out.added,
        jobs: out
            .jobs
            .into_iter()
            .map(|(name, from_epoch)| GrownJob { name, from_epoch })
            .collect(),
        dataset: dataset_view(&d),
    }))
}

/// Preload a working set of the dataset (a subset, prepared by the pipeline its jobs will
/// use) into the cache and pin it there until released: it loads in the background, below
/// running jobs' loads (poll the dataset: its `preload.state` becomes `ready`); a job on the
/// same pipeline then decodes nothing of it. Preloads pin half the cache at most.
#[utoipa::path(
    tag = "datasets",
    params(("name" = String, Path, description = "the dataset's name", example = "example")),
    request_body = PreloadRequest,
    responses(
        (status = 202, description = "accepted: `preload.state` is `loading`", body = DatasetView),
        PreloadErrors
    )
)]
#[post("/v1/datasets/{name}/preload")]
async fn preload_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<PreloadRequest>,
) -> Result<HttpResponse> {
    preload::preload_dataset(&state.registry, &name, body.into_inner()).await?;
    let d = state.registry.dataset(&name)?;
    Ok(HttpResponse::Accepted().json(dataset_view(&d)))
}

/// Release the dataset's preload: its elements stay cached, evictable like any other.
#[utoipa::path(
    tag = "datasets",
    params(("name" = String, Path, description = "the dataset's name", example = "example")),
    responses((status = 204, description = "released"), ReleaseErrors)
)]
#[delete("/v1/datasets/{name}/preload")]
async fn release_preload(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse> {
    preload::release_preload(&state.registry, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DeleteQuery {
    /// Stop the jobs that use the dataset first (without it, a dataset in use is kept).
    #[serde(default)]
    force: bool,
}

/// Delete a dataset (refused while jobs use it, unless `force=true`).
#[utoipa::path(
    tag = "datasets",
    params(
        ("name" = String, Path, description = "the dataset's name", example = "example"),
        DeleteQuery
    ),
    responses((status = 204, description = "deleted"), DeleteErrors)
)]
#[delete("/v1/datasets/{name}")]
async fn delete_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
    q: web::Query<DeleteQuery>,
) -> Result<HttpResponse> {
    datasets::delete_dataset(&state.registry, &name, q.force).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(create_dataset)
        .service(list_datasets)
        .service(get_dataset)
        .service(delete_dataset)
        .service(dataset_failures)
        .service(reindex_dataset)
        .service(append_dataset)
        .service(preload_dataset)
        .service(release_preload);
}
