//! `/v1/jobs`: register (or join as another rank), list, get, delete.

use actix_web::{HttpResponse, delete, get, post, web};
use serde_json::json;

use super::views::{job_json, registration_json};
use crate::error::{Error, Result};
use crate::registry::AppState;
use crate::registry::jobs::{self, JobRequest};

#[post("/v1/jobs")]
async fn create_job(
    state: web::Data<AppState>,
    body: web::Json<JobRequest>,
) -> Result<HttpResponse> {
    let (body, created) = jobs::register_job(&state, body.into_inner(), registration_json).await?;
    Ok(if created {
        HttpResponse::Created().json(body)
    } else {
        HttpResponse::Ok().json(body)
    })
}

#[get("/v1/jobs")]
async fn list_jobs(state: web::Data<AppState>) -> Result<HttpResponse> {
    let inner = state.inner.lock().map_err(Error::internal)?;
    let list: Vec<_> = inner.jobs.values().map(job_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "jobs": list })))
}

#[get("/v1/jobs/{name}")]
async fn get_job(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse> {
    let inner = state.inner.lock().map_err(Error::internal)?;
    let j = inner
        .jobs
        .get(name.as_str())
        .ok_or_else(|| Error::job_not_found(&name))?;
    Ok(HttpResponse::Ok().json(job_json(j)))
}

#[delete("/v1/jobs/{name}")]
async fn delete_job(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse> {
    jobs::stop_job(&state, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(create_job)
        .service(list_jobs)
        .service(get_job)
        .service(delete_job);
}
