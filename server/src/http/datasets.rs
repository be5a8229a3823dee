//! `/v1/datasets`: create (indexed in the background), list, get, failures, delete.

use actix_web::{HttpResponse, delete, get, post, web};
use actors::storage::SourceSpec;
use serde::Deserialize;
use serde_json::json;

use super::views::dataset_json;
use crate::error::{Error, Result};
use crate::registry::{AppState, datasets};

/// `POST /v1/datasets`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateDataset {
    pub name: String,
    pub source: SourceSpec,
}

#[post("/v1/datasets")]
async fn create_dataset(
    state: web::Data<AppState>,
    body: web::Json<CreateDataset>,
) -> Result<HttpResponse> {
    let CreateDataset { name, source } = body.into_inner();
    let st = state.clone().into_inner();
    let created = name.clone();
    // Persisting is a redb commit: on the blocking pool, never on the HTTP worker.
    web::block(move || datasets::create_dataset(&st, created, source))
        .await
        .map_err(Error::internal)??;
    let inner = state.inner.lock().map_err(Error::internal)?;
    let d = inner
        .datasets
        .get(&name)
        .ok_or_else(|| Error::dataset_not_found(&name))?;
    Ok(HttpResponse::Accepted().json(dataset_json(d)))
}

#[get("/v1/datasets")]
async fn list_datasets(state: web::Data<AppState>) -> Result<HttpResponse> {
    let inner = state.inner.lock().map_err(Error::internal)?;
    let list: Vec<_> = inner.datasets.values().map(dataset_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "datasets": list })))
}

#[get("/v1/datasets/{name}")]
async fn get_dataset(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse> {
    let inner = state.inner.lock().map_err(Error::internal)?;
    let d = inner
        .datasets
        .get(name.as_str())
        .ok_or_else(|| Error::dataset_not_found(&name))?;
    Ok(HttpResponse::Ok().json(dataset_json(d)))
}

#[get("/v1/datasets/{name}/failures")]
async fn dataset_failures(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse> {
    let list: Vec<_> = datasets::failures(&state, &name)?
        .into_iter()
        .map(|(element, kind, message)| json!({"element": element, "kind": kind, "message": message}))
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "failures": list })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

#[delete("/v1/datasets/{name}")]
async fn delete_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
    q: web::Query<DeleteQuery>,
) -> Result<HttpResponse> {
    datasets::delete_dataset(&state, &name, q.force).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(create_dataset)
        .service(list_datasets)
        .service(get_dataset)
        .service(delete_dataset)
        .service(dataset_failures);
}
