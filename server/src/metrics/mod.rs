//! Prometheus metrics (`GET /metrics`) and the process figures the dashboard shows.
//!
//! Each server owns one `metrics-exporter-prometheus` recorder and writes to it through
//! `metrics::with_local_recorder`, never through the process-global recorder: `joader demo`,
//! the benchmarks and tests may run two servers in one process, and a shared registry would
//! mix their counters. Most values already live in atomics the actors maintain (`CacheStats`,
//! every job's `JobStats`); a scrape copies them into the recorder (`absolute` counters,
//! gauges) and renders it. HTTP requests are recorded when they happen.
//!
//! The exporter's counters are integers; the few counters in seconds (CPU, loader busy time,
//! job stall) are fractional, so they are rendered here, in the same text format, after the
//! exporter's output.
//!
//! The dashboard's charts come from a short history (one sample a second, ten minutes) of
//! the cumulative counters, taken here and served by `GET /v1/stats/history`, so that a page
//! opened at any time shows the last minutes at once.
//!
//! Naming follows `joader_<what>_<unit>` with `_total` on counters. Labels are of low
//! cardinality: `dataset`, `job_name`, `kind`, `state`, `method`, `route` (the route *pattern*,
//! never the raw path) and `status`. Never an element id. The job's label is `job_name`, not
//! `job`: Prometheus attaches `job` (the scrape job) to every series and would rename ours to
//! `exported_job` under its default `honor_labels: false`.

mod record;
mod render;

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::Error;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use metrics::counter;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use serde_json::json;

use crate::procstat::process_stats;
use crate::registry::AppState;
use record::{JobSeries, histogram_http, record_cache, record_jobs};
use render::{describe_all, float_counter};

/// Buckets of `joader_http_request_duration_seconds`.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The recorder of one server, and the recent history the dashboard draws.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    jobs: Mutex<BTreeMap<String, JobSeries>>,
    history: Mutex<VecDeque<serde_json::Value>>,
}

/// Seconds between two samples of the history.
pub const HISTORY_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: ten minutes.
pub const HISTORY_LEN: usize = 600;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("joader_http_request_duration_seconds".into()),
                HTTP_BUCKETS,
            )
            .map(|b| b.build_recorder())
            // Only an empty bucket list is refused, and ours is a non-empty constant.
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        let m = Self {
            recorder,
            handle,
            jobs: Mutex::new(BTreeMap::new()),
            history: Mutex::new(VecDeque::with_capacity(HISTORY_LEN)),
        };
        m.with(describe_all);
        m
    }

    /// Records one sample of the cumulative counters the dashboard charts (rates are
    /// differences of consecutive samples, so the page needs no clock of its own).
    pub fn sample(&self, state: &AppState) {
        let s = &state.stats;
        let process = process_stats();
        let jobs: serde_json::Map<String, serde_json::Value> = state
            .inner
            .lock()
            .map(|inner| {
                inner
                    .jobs
                    .iter()
                    .map(|(name, j)| {
                        (
                            name.clone(),
                            json!({
                                "acknowledged": j.stats.acknowledged.load(Relaxed),
                                "stall_s": j.stats.stall_us.load(Relaxed) as f64 / 1e6,
                            }),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let point = json!({
            "t": state.started.elapsed().as_secs_f64(),
            "requests": s.requests.load(Relaxed),
            "hits": s.hits.load(Relaxed),
            "decodes": s.decodes.load(Relaxed),
            "loads": s.loads.load(Relaxed),
            "bytes_read": s.bytes_read.load(Relaxed),
            "bytes_in_use": s.bytes_in_use.load(Relaxed),
            "capacity_bytes": s.capacity_bytes.load(Relaxed),
            "slots_in_use": s.slots_in_use.load(Relaxed),
            "cpu_s": process.map(|p| p.cpu_seconds),
            "rss_bytes": process.map(|p| p.rss_bytes),
            "jobs": jobs,
        });
        if let Ok(mut h) = self.history.lock() {
            if h.len() == HISTORY_LEN {
                h.pop_front();
            }
            h.push_back(point);
        }
    }

    /// The samples taken after `since` (seconds of uptime), oldest first.
    pub fn history(&self, since: f64) -> Vec<serde_json::Value> {
        self.history
            .lock()
            .map(|h| {
                h.iter()
                    .filter(|p| p["t"].as_f64().is_some_and(|t| t > since))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.recorder, f)
    }

    /// Copies the server's counters into the recorder and renders the Prometheus text.
    pub fn render(&self, state: &AppState) -> String {
        let mut extra = String::new();
        let stalls = self.with(|| {
            record_cache(state);
            record_jobs(&self.jobs, state)
        });
        let stalls: Vec<(&str, &str, f64)> = stalls
            .iter()
            .map(|(name, dataset, s)| (name.as_str(), dataset.as_str(), *s))
            .collect();
        float_counter(
            &mut extra,
            "joader_job_stall_seconds_total",
            "time the job's ring sat empty while its client was attached and had credit (sampled at every cache tick, summed over ranks)",
            &stalls,
        );
        let s = &state.stats;
        float_counter(
            &mut extra,
            "joader_loader_busy_seconds_total",
            "time the loader workers spent reading and preparing elements, summed over workers",
            &[("", "", s.loader_busy_us.load(Relaxed) as f64 / 1e6)],
        );
        if let Some(p) = process_stats() {
            float_counter(
                &mut extra,
                "joader_process_cpu_seconds_total",
                "user and system CPU time of the joader process",
                &[("", "", p.cpu_seconds)],
            );
        }
        let mut out = self.handle.render();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&extra);
        out
    }

    /// Counts an HTTP request by method, route pattern and status (an actix-web `wrap_fn`).
    pub fn observe<S, B>(
        self: &Arc<Self>,
        req: ServiceRequest,
        srv: &S,
    ) -> impl Future<Output = Result<ServiceResponse<B>, Error>> + 'static + use<S, B>
    where
        S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
        S::Future: 'static,
    {
        let start = Instant::now();
        let method = req.method().as_str().to_string();
        // The pattern (`/v1/jobs/{name}`), never the raw path: label values stay few.
        let route = req
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_string());
        let fut = srv.call(req);
        let me = self.clone();
        async move {
            let res = fut.await;
            let status = match &res {
                Ok(r) => r.status(),
                Err(e) => e.as_response_error().status_code(),
            };
            let secs = start.elapsed().as_secs_f64();
            me.with(|| {
                counter!("joader_http_requests_total",
                    "method" => method.clone(), "route" => route.clone(), "status" => status.as_u16().to_string())
                .increment(1);
                histogram_http(&method, &route, secs);
            });
            res
        }
    }
}
