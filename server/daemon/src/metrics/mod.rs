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
//! never the raw path), `status` and `stage` (the fixed list of `crate::stages::SERVER`). Never an element id. The job's label is `job_name`, not
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

use crate::stages::{HTTP, METRICS};
use joader_stages as stages;

use crate::procstat::process_stats;
use crate::state::AppState;
use record::{JobSeries, histogram_http, record_cache, record_jobs, series_len};
use render::{describe_all, family};

/// Buckets of `joader_http_request_duration_seconds`.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The recorder of one server, and the recent history the dashboard draws.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    jobs: Mutex<BTreeMap<String, JobSeries>>,
    history: Mutex<VecDeque<Sample>>,
}

/// One sample of the history, compact (the JSON is made when asked for).
struct Sample {
    t: f64,
    /// In the order of [`SAMPLE_COUNTERS`].
    counters: [u64; 8],
    cpu_s: Option<f64>,
    rss_bytes: Option<u64>,
    /// (job name, acknowledged, stall seconds) of the jobs that had not ended.
    jobs: Box<[(Box<str>, u64, f64)]>,
}

/// The names of a sample's counters in the history's JSON.
const SAMPLE_COUNTERS: [&str; 8] = [
    "requests",
    "hits",
    "decodes",
    "loads",
    "bytes_read",
    "bytes_in_use",
    "capacity_bytes",
    "slots_in_use",
];

impl Sample {
    fn to_json(&self) -> serde_json::Value {
        let mut v = json!({
            "t": self.t,
            "cpu_s": self.cpu_s,
            "rss_bytes": self.rss_bytes,
        });
        for (name, n) in SAMPLE_COUNTERS.iter().zip(self.counters) {
            v[*name] = json!(n);
        }
        let jobs: serde_json::Map<String, serde_json::Value> = self
            .jobs
            .iter()
            .map(|(name, acked, stall)| {
                (
                    name.to_string(),
                    json!({"acknowledged": acked, "stall_s": stall}),
                )
            })
            .collect();
        v["jobs"] = serde_json::Value::Object(jobs);
        v
    }
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
    /// differences of consecutive samples, so the page needs no clock of its own). Jobs that
    /// ended are left out (their figures no longer change), so a sample's size is bounded by
    /// the jobs running, not by the jobs the server has served.
    pub fn sample(&self, state: &AppState) {
        let _cpu = stages::enter(&METRICS);
        let s = &state.registry.stats();
        let process = process_stats();
        let jobs: Box<[(Box<str>, u64, f64)]> = state
            .registry
            .jobs()
            .iter()
            .filter(|j| !j.has_ended())
            .map(|j| {
                (
                    j.name.as_str().into(),
                    j.stats.acknowledged.load(Relaxed),
                    j.stats.stall_us.load(Relaxed) as f64 / 1e6,
                )
            })
            .collect();
        let point = Sample {
            t: state.registry.uptime().as_secs_f64(),
            counters: [
                s.requests.load(Relaxed),
                s.hits.load(Relaxed),
                s.decodes.load(Relaxed),
                s.loads.load(Relaxed),
                s.bytes_read.load(Relaxed),
                s.bytes_in_use.load(Relaxed),
                s.capacity_bytes.load(Relaxed),
                s.slots_in_use.load(Relaxed),
            ],
            cpu_s: process.map(|p| p.cpu_seconds),
            rss_bytes: process.map(|p| p.rss_bytes),
            jobs,
        };
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
                    .filter(|p| p.t > since)
                    .map(Sample::to_json)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Job names whose series the exporter remembers.
    pub fn job_series(&self) -> usize {
        series_len(&self.jobs)
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.recorder, f)
    }

    /// Copies the server's counters into the recorder and renders the Prometheus text.
    pub fn render(&self, state: &AppState) -> String {
        let _cpu = stages::enter(&METRICS);
        let mut extra = String::new();
        let labelled = self.with(|| {
            record_cache(state);
            record_jobs(&self.jobs, state)
        });
        for (name, kind, help, rows) in &labelled.families {
            family(&mut extra, name, kind, help, rows);
        }
        let s = &state.registry.stats();
        family(
            &mut extra,
            "joader_loader_busy_seconds_total",
            "counter",
            "time the loader workers spent reading and preparing elements, summed over workers",
            &[(vec![], s.loader_busy_us.load(Relaxed) as f64 / 1e6)],
        );
        if let Some(objects) = state.registry.objects() {
            render::objects(&mut extra, objects.stats());
        }
        let tier = state.registry.objects().and_then(|o| o.tier());
        render::disk_cache(&mut extra, tier.map(|t| &**t.stats()));
        // This thread's time so far, so that a scrape's own work is in its figures.
        stages::flush();
        let rows: Vec<_> = crate::stages::SERVER
            .iter()
            .map(|st| (vec![("stage", st.name().to_string())], st.seconds()))
            .collect();
        family(
            &mut extra,
            "joader_stage_cpu_seconds_total",
            "counter",
            "thread CPU time of the joader process by stage (read, decode, resize, loader, slot_write, cache, sampler, http, metrics, fetch, runtime); the stages add up to about joader_process_cpu_seconds_total",
            &rows,
        );
        if let Some(p) = process_stats() {
            family(
                &mut extra,
                "joader_process_cpu_seconds_total",
                "counter",
                "user and system CPU time of the joader process",
                &[(vec![], p.cpu_seconds)],
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
        // This runs on an HTTP worker: what the worker does outside a stage of its own (such
        // as `metrics`) is HTTP, from the first request on.
        stages::set_base(&HTTP);
        let start = Instant::now();
        // Any token is a method to HTTP: only the standard ones are label values, so that
        // invented methods cannot grow the series without bound.
        let method = match req.method().as_str() {
            m @ ("GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "CONNECT" | "OPTIONS" | "TRACE"
            | "PATCH") => m,
            _ => "other",
        }
        .to_string();
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
