//! `/v1/jobs`: register (or join as another rank), list, get, delete.

use actix_web::{HttpResponse, delete, get, post, web};
use utoipa_actix_web::service_config::ServiceConfig;

use super::error::errors;
use super::views::{JobList, JobView, RecordView, Registration, job_view, registration_view};
use crate::error::{Error, Result};
use crate::registry::jobs::{self, JobRequest};
use crate::state::AppState;

// Every route may also answer `internal` and, with a token, `unauthorized` (`super::openapi`).
errors!(CreateErrors: InvalidRequest, EmptySubset, InvalidResume, InvalidReplay, DatasetNotFound, JobExists, DatasetNotReady,
    VersionMismatch, TooLarge, CacheFull, ShuttingDown);
errors!(GetErrors: JobNotFound);
errors!(RecordErrors: InvalidRequest, RecordNotFound);

/// Register a job, or another rank of it (same name and parameters); returns the rings to
/// open.
#[utoipa::path(
    tag = "jobs",
    request_body = JobRequest,
    responses(
        (status = 201, description = "created", body = Registration),
        (status = 200, description = "another rank of a running job", body = Registration),
        CreateErrors
    )
)]
#[post("/v1/jobs")]
async fn create_job(
    state: web::Data<AppState>,
    body: web::Json<JobRequest>,
) -> Result<HttpResponse> {
    let (body, created) =
        jobs::register_job(&state.registry, body.into_inner(), registration_view).await?;
    Ok(if created {
        HttpResponse::Created().json(body)
    } else {
        HttpResponse::Ok().json(body)
    })
}

/// List the jobs with their epoch, position, samples/s, hit ratio and stall.
#[utoipa::path(tag = "jobs", responses((status = 200, description = "the jobs", body = JobList)))]
#[get("/v1/jobs")]
async fn list_jobs(state: web::Data<AppState>) -> Result<HttpResponse> {
    let jobs = state.registry.jobs().iter().map(|j| job_view(j)).collect();
    Ok(HttpResponse::Ok().json(JobList { jobs }))
}

/// A job.
#[utoipa::path(
    tag = "jobs",
    params(("name" = String, Path, description = "the job's name", example = "example")),
    responses((status = 200, description = "the job", body = JobView), GetErrors)
)]
#[get("/v1/jobs/{name}")]
async fn get_job(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse> {
    let j = state.registry.job(&name)?;
    Ok(HttpResponse::Ok().json(job_view(&j)))
}

/// Stop a job and release what it holds.
#[utoipa::path(
    tag = "jobs",
    params(("name" = String, Path, description = "the job's name", example = "example")),
    responses((status = 204, description = "deleted"), GetErrors)
)]
#[delete("/v1/jobs/{name}")]
async fn delete_job(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse> {
    jobs::stop_job(&state.registry, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// The order in which a job that set `record` received an epoch, per rank (kept in the data
/// dir after the job ends, for its last 16 epochs, until a job of the same name records).
#[utoipa::path(
    tag = "jobs",
    params(
        ("name" = String, Path, description = "the job's name", example = "example"),
        ("epoch" = u32, Path, description = "the epoch (0-based)", example = 0)
    ),
    responses((status = 200, description = "the recorded epoch", body = RecordView), RecordErrors)
)]
#[get("/v1/jobs/{name}/record/{epoch}")]
async fn get_record(
    state: web::Data<AppState>,
    path: web::Path<(String, u32)>,
) -> Result<HttpResponse> {
    let (name, epoch) = path.into_inner();
    crate::registry::check_name("job", &name)?;
    let data_dir = state.registry.config().data_dir.clone();
    let job = name.clone();
    let rec = actix_web::rt::task::spawn_blocking(move || {
        crate::registry::record::read(&data_dir, &job, epoch)
    })
    .await
    .map_err(Error::internal)??;
    Ok(HttpResponse::Ok().json(RecordView {
        ranks: rec.ranks(),
        job: name,
        epoch,
        world_size: rec.world_size,
        first_position: rec.first,
        order: rec.order,
    }))
}

pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(create_job)
        .service(get_record)
        .service(list_jobs)
        .service(get_job)
        .service(delete_job);
}
