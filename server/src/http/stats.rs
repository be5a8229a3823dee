//! Service routes: health, `/v1/stats`, its history (what the dashboard charts) and the
//! Prometheus `/metrics`.

use actix_web::{HttpResponse, get, web};
use serde::Deserialize;
use serde_json::json;

use super::views::stats_json;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::registry::AppState;

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

#[get("/v1/stats")]
async fn cache_stats(
    state: web::Data<AppState>,
    recorder: web::Data<Metrics>,
) -> Result<HttpResponse> {
    let mut body = stats_json(&state);
    body["state"] = state_sizes(&state, &recorder);
    Ok(HttpResponse::Ok().json(body))
}

/// The sizes of the server's per-job state (each returns to its idle value once the jobs
/// are gone and the retention periods have passed: see `registry::housekeep`).
fn state_sizes(state: &AppState, recorder: &Metrics) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let (jobs, retired, registering) = state
        .inner
        .lock()
        .map(|i| (i.jobs.len(), i.retired.len(), i.registering.len()))
        .unwrap_or_default();
    json!({
        "jobs": jobs,
        "retired_job_names": retired,
        "registering": registering,
        "metric_job_series": recorder.job_series(),
        "cache_open_jobs": state.stats.open_jobs.load(Relaxed),
        "cache_sources": state.stats.open_sources.load(Relaxed),
    })
}

#[get("/metrics")]
async fn metrics(state: web::Data<AppState>, recorder: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(recorder.render(&state))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Only samples taken after this many seconds of uptime.
    #[serde(default)]
    since: Option<f64>,
}

#[get("/v1/stats/history")]
async fn stats_history(
    recorder: web::Data<Metrics>,
    q: web::Query<HistoryQuery>,
) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(json!({
        "interval_s": crate::metrics::HISTORY_INTERVAL.as_secs_f64(),
        "samples": recorder.history(q.since.unwrap_or(f64::NEG_INFINITY)),
    })))
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(healthz)
        .service(metrics)
        .service(cache_stats)
        .service(stats_history);
}
