//! Service routes: health, `/v1/stats`, its history (what the dashboard charts) and the
//! Prometheus `/metrics`.

use actix_web::{HttpResponse, get, web};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_actix_web::service_config::ServiceConfig;

use super::error::errors;
use super::views::{Health, History, StateSizes, Stats, stats_view};
use crate::error::Result;
use crate::metrics::Metrics;
use crate::state::AppState;

errors!(HistoryErrors: InvalidRequest);

/// Liveness.
#[utoipa::path(
    tag = "service",
    responses((status = 200, description = "the server is up", body = Health))
)]
#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok".into(),
    })
}

/// Cache, loader and sampler counters, the process's CPU seconds and resident memory, and
/// the sizes of the per-job state.
#[utoipa::path(
    tag = "service",
    responses((status = 200, description = "the counters", body = Stats))
)]
#[get("/v1/stats")]
async fn cache_stats(
    state: web::Data<AppState>,
    recorder: web::Data<Metrics>,
) -> Result<HttpResponse> {
    let sizes = state_sizes(&state, &recorder);
    Ok(HttpResponse::Ok().json(stats_view(&state, sizes)))
}

/// The sizes of the server's per-job state (each returns to its idle value once the jobs
/// are gone and the retention periods have passed: see `registry::housekeep`).
fn state_sizes(state: &AppState, recorder: &Metrics) -> StateSizes {
    use std::sync::atomic::Ordering::Relaxed;
    let sizes = state.registry.sizes();
    StateSizes {
        jobs: sizes.jobs as u64,
        retired_job_names: sizes.retired_job_names as u64,
        registering: sizes.registering as u64,
        metric_job_series: recorder.job_series() as u64,
        cache_open_jobs: state.registry.stats().open_jobs.load(Relaxed),
        cache_sources: state.registry.stats().open_sources.load(Relaxed),
    }
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(
    tag = "service",
    responses((status = 200, description = "the metrics", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8"))
)]
#[get("/metrics")]
async fn metrics(state: web::Data<AppState>, recorder: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(recorder.render(&state))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct HistoryQuery {
    /// Only samples taken after this many seconds of uptime.
    #[serde(default)]
    since: Option<f64>,
}

/// The last ten minutes of cumulative counters, one sample a second (what the dashboard
/// charts).
#[utoipa::path(
    tag = "service",
    params(HistoryQuery),
    responses((status = 200, description = "the samples", body = History), HistoryErrors)
)]
#[get("/v1/stats/history")]
async fn stats_history(
    recorder: web::Data<Metrics>,
    q: web::Query<HistoryQuery>,
) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(History {
        interval_s: crate::metrics::HISTORY_INTERVAL.as_secs_f64(),
        samples: recorder.history(q.since.unwrap_or(f64::NEG_INFINITY)),
    }))
}

pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(healthz)
        .service(metrics)
        .service(cache_stats)
        .service(stats_history);
}
