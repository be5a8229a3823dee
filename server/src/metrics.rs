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

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::Error;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actors::service::{JobState, JobStats};
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use serde_json::json;

use crate::state::AppState;

/// Buckets of `joader_http_request_duration_seconds`.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Kinds of element failures (`StorageError::code`, `PipelineError::code`) seen in practice.
const COMMON_FAILURE_KINDS: [&str; 6] = [
    "read_failed",
    "not_found",
    "not_an_image",
    "corrupt_image",
    "image_too_large",
    "unsupported_image",
];

/// Job states exported by `joader_jobs` (each scrape sets all of them, zeros included).
const JOB_STATES: [&str; 4] = ["waiting", "running", "finished", "failed"];

/// The per-job integer counters, in the order of [`JobSeries::counts`].
const JOB_COUNTERS: [(&str, &str); 7] = [
    (
        "joader_job_sampled_total",
        "deliveries the sampler decided for the job",
    ),
    (
        "joader_ring_pushed_total",
        "records pushed into the job's delivery rings (data and error records)",
    ),
    (
        "joader_ring_popped_total",
        "records the job's client took from its rings and acknowledged (ring occupancy = pushed - popped)",
    ),
    (
        "joader_job_delivered_samples_total",
        "samples the job's client received and acknowledged",
    ),
    (
        "joader_job_hits_total",
        "deliveries to the job served by a cached slot or another job's load in flight",
    ),
    (
        "joader_job_misses_total",
        "deliveries to the job that needed a load of their own",
    ),
    (
        "joader_job_errors_total",
        "elements that failed to load, delivered to the job as error records",
    ),
];

/// What the exporter remembers of a job name between scrapes.
///
/// A job name can be reused once its job finished or failed, and the new job's counters
/// start at zero. Prometheus counters must not go down, so the series of a name continues
/// from what the stopped jobs of that name counted (`state::Inner::retired`), and never
/// goes down.
struct JobSeries {
    id: u64,
    dataset: String,
    counts: [u64; 7],
    stall: f64,
}

pub(crate) fn job_counts(s: &JobStats) -> [u64; 7] {
    let acked = s.acknowledged.load(Relaxed);
    [
        s.sampled.load(Relaxed),
        s.delivered.load(Relaxed),
        acked,
        acked,
        s.hits.load(Relaxed),
        s.misses.load(Relaxed),
        s.errors.load(Relaxed),
    ]
}

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
        self.with(|| {
            record_cache(state);
            self.record_jobs(state, &mut extra);
        });
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

    fn record_jobs(&self, state: &AppState, extra: &mut String) {
        let mut by_state: BTreeMap<&str, u64> = JOB_STATES.iter().map(|s| (*s, 0)).collect();
        let Ok(mut series) = self.jobs.lock() else {
            return;
        };
        let mut present = Vec::new();
        if let Ok(inner) = state.inner.lock() {
            for (name, d) in &inner.datasets {
                let items = d.index.as_ref().map_or(0, |i| i.items.len());
                gauge!("joader_dataset_items", "dataset" => name.clone()).set(items as f64);
            }
            for (name, j) in &inner.jobs {
                let st = match j.stats.state() {
                    JobState::Waiting => "waiting",
                    JobState::Running => "running",
                    JobState::Finished => "finished",
                    JobState::Failed(_) => "failed",
                };
                *by_state.entry(st).or_default() += 1;
                let e = series.entry(name.clone()).or_insert_with(|| JobSeries {
                    id: j.id,
                    dataset: j.dataset.clone(),
                    counts: [0; 7],
                    stall: 0.0,
                });
                // A job under a reused name continues from what the stopped ones of that name
                // counted (recorded when they stopped, so no scrape can miss it).
                let retired = inner.retired.get(name).copied().unwrap_or_default();
                e.id = j.id;
                e.dataset = j.dataset.clone();
                let now = job_counts(&j.stats);
                for i in 0..now.len() {
                    e.counts[i] = e.counts[i].max(retired.counts[i] + now[i]);
                }
                e.stall = e
                    .stall
                    .max(retired.stall_s + j.stats.stall_us.load(Relaxed) as f64 / 1e6);
                let labels = [("job_name", name.clone()), ("dataset", j.dataset.clone())];
                for (i, (metric, _)) in JOB_COUNTERS.iter().enumerate() {
                    counter!(*metric, &labels).absolute(e.counts[i]);
                }
                let s = &j.stats;
                gauge!("joader_job_epoch", &labels).set(s.epoch.load(Relaxed) as f64);
                gauge!("joader_job_epoch_position", &labels).set(s.position.load(Relaxed) as f64);
                gauge!("joader_job_subset_size", &labels).set(j.subset_len as f64);
                gauge!("joader_job_samples_per_second", &labels).set(j.rate());
                gauge!("joader_job_running", &labels).set(f64::from(u8::from(st == "running")));
                present.push(name.clone());
            }
        }
        // Jobs deleted since: their counters stay where they were; they no longer run.
        for (name, e) in series.iter() {
            if !present.contains(name) {
                let labels = [("job_name", name.clone()), ("dataset", e.dataset.clone())];
                gauge!("joader_job_running", &labels).set(0.0);
                gauge!("joader_job_samples_per_second", &labels).set(0.0);
            }
        }
        for (st, n) in by_state {
            gauge!("joader_jobs", "state" => st).set(n as f64);
        }
        let stalls: Vec<(&str, &str, f64)> = series
            .iter()
            .map(|(name, e)| (name.as_str(), e.dataset.as_str(), e.stall))
            .collect();
        float_counter(
            extra,
            "joader_job_stall_seconds_total",
            "time the job's ring sat empty while its client was attached and had credit (sampled at every cache tick, summed over ranks)",
            &stalls,
        );
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

fn histogram_http(method: &str, route: &str, secs: f64) {
    metrics::histogram!("joader_http_request_duration_seconds",
        "method" => method.to_string(), "route" => route.to_string())
    .record(secs);
}

fn record_cache(state: &AppState) {
    let s = &state.stats;
    let c = |name: &'static str, v: u64| counter!(name).absolute(v);
    c("joader_cache_requests_total", s.requests.load(Relaxed));
    c("joader_cache_hits_total", s.hits.load(Relaxed));
    c("joader_cache_misses_total", s.misses.load(Relaxed));
    c("joader_decodes_saved_total", s.hits.load(Relaxed));
    c("joader_loads_total", s.loads.load(Relaxed));
    c("joader_decodes_total", s.decodes.load(Relaxed));
    c(
        "joader_storage_read_bytes_total",
        s.bytes_read.load(Relaxed),
    );
    c("joader_load_errors_total", s.load_errors.load(Relaxed));
    counter!("joader_cache_evictions_total", "reason" => "unneeded")
        .absolute(s.evictions_unneeded.load(Relaxed));
    counter!("joader_cache_evictions_total", "reason" => "needed")
        .absolute(s.evictions_needed.load(Relaxed));
    c("joader_sampler_rounds_total", s.rounds.load(Relaxed));
    c("joader_sampler_picks_total", s.round_elements.load(Relaxed));
    c(
        "joader_sampler_pick_jobs_total",
        s.round_deliveries.load(Relaxed),
    );
    // The common kinds are always exported (at zero until they happen), so that dashboards
    // and alerts have a series to look at.
    for kind in COMMON_FAILURE_KINDS {
        counter!("joader_load_failures_total", "kind" => kind).absolute(0);
    }
    if let Ok(kinds) = s.failures_by_kind.lock() {
        for (kind, n) in kinds.iter() {
            counter!("joader_load_failures_total", "kind" => kind.clone()).absolute(*n);
        }
    }
    let g = |name: &'static str, v: f64| gauge!(name).set(v);
    g("joader_shm_used_bytes", s.bytes_in_use.load(Relaxed) as f64);
    g(
        "joader_shm_capacity_bytes",
        s.capacity_bytes.load(Relaxed) as f64,
    );
    g(
        "joader_cache_slots_in_use",
        s.slots_in_use.load(Relaxed) as f64,
    );
    g(
        "joader_cache_slots_capacity",
        s.slot_capacity.load(Relaxed) as f64,
    );
    g(
        "joader_cache_waiting_payloads",
        s.waiting_for_space.load(Relaxed) as f64,
    );
    g(
        "joader_loader_queue_depth",
        s.loader_queue.load(Relaxed) as f64,
    );
    g(
        "joader_loader_workers",
        state.config.loader_workers.max(1) as f64,
    );
    g(
        "joader_uptime_seconds",
        state.started.elapsed().as_secs_f64(),
    );
    if let Some(p) = process_stats() {
        g("joader_process_resident_memory_bytes", p.rss_bytes as f64);
        g("joader_process_threads", p.threads as f64);
    }
    gauge!("joader_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

fn describe_all() {
    describe_counter!(
        "joader_cache_requests_total",
        "element requests: deliveries the sampler routed to the cache"
    );
    describe_counter!(
        "joader_cache_hits_total",
        "requests served by a cached slot or a load already in flight (hit ratio = hits / requests)"
    );
    describe_counter!(
        "joader_cache_misses_total",
        "requests that needed a load of their own"
    );
    describe_counter!(
        "joader_decodes_saved_total",
        "deliveries served without a read and preparation of their own, thanks to sharing"
    );
    describe_counter!(
        "joader_loads_total",
        "elements read from storage (once for all pipelines that wanted them)"
    );
    describe_counter!(
        "joader_decodes_total",
        "images decoded (pipelines other than raw)"
    );
    describe_counter!(
        "joader_storage_read_bytes_total",
        Unit::Bytes,
        "bytes read from storage"
    );
    describe_counter!(
        "joader_load_errors_total",
        "element preparations that failed (any kind)"
    );
    describe_counter!(
        "joader_load_failures_total",
        "elements that failed to load, by kind (read_failed, corrupt_image, ...)"
    );
    describe_counter!(
        "joader_cache_evictions_total",
        "cached elements evicted to make room, by reason: unneeded (no job still needed it this epoch) or needed"
    );
    describe_counter!(
        "joader_sampler_rounds_total",
        "sampling rounds (one pick per job with credit)"
    );
    describe_counter!(
        "joader_sampler_picks_total",
        "distinct elements picked in sampling rounds"
    );
    describe_counter!(
        "joader_sampler_pick_jobs_total",
        "jobs served by the picks (mean share size = pick_jobs / picks)"
    );
    for (name, help) in JOB_COUNTERS {
        describe_counter!(name, help);
    }
    describe_counter!(
        "joader_http_requests_total",
        "HTTP requests by method, route pattern and status"
    );
    describe_histogram!(
        "joader_http_request_duration_seconds",
        Unit::Seconds,
        "HTTP request latency by method and route pattern"
    );
    describe_gauge!(
        "joader_shm_used_bytes",
        Unit::Bytes,
        "bytes of the shared-memory cache arena in use"
    );
    describe_gauge!(
        "joader_shm_capacity_bytes",
        Unit::Bytes,
        "size of the shared-memory cache arena"
    );
    describe_gauge!(
        "joader_cache_slots_in_use",
        "cache slots holding an element"
    );
    describe_gauge!("joader_cache_slots_capacity", "cache slots in the segment");
    describe_gauge!(
        "joader_cache_waiting_payloads",
        "prepared elements waiting for room because everything cached is still unread"
    );
    describe_gauge!(
        "joader_loader_queue_depth",
        "loads queued for the loader workers"
    );
    describe_gauge!("joader_loader_workers", "loader worker threads");
    describe_gauge!(
        "joader_uptime_seconds",
        Unit::Seconds,
        "time since the server started"
    );
    describe_gauge!(
        "joader_process_resident_memory_bytes",
        Unit::Bytes,
        "resident memory of the joader process (shared-memory pages it touched included)"
    );
    describe_gauge!("joader_process_threads", "threads of the joader process");
    describe_gauge!("joader_build_info", "1, labelled with the joader version");
    describe_gauge!("joader_dataset_items", "items indexed in the dataset");
    describe_gauge!("joader_jobs", "registered jobs by state");
    describe_gauge!("joader_job_epoch", "the job's current epoch");
    describe_gauge!(
        "joader_job_epoch_position",
        "position of the last sampled element in the job's epoch"
    );
    describe_gauge!("joader_job_subset_size", "elements in the job's subset");
    describe_gauge!(
        "joader_job_samples_per_second",
        "samples per second the job's client acknowledged, over the last second or so"
    );
    describe_gauge!("joader_job_running", "1 while the job runs");
}

/// Appends a counter with fractional values in the Prometheus text format. `series` holds
/// (job, dataset, value); empty names mean no labels.
fn float_counter(out: &mut String, name: &str, help: &str, series: &[(&str, &str, f64)]) {
    if series.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    for (job, dataset, v) in series {
        if job.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(
                out,
                "{name}{{job_name=\"{}\",dataset=\"{}\"}} {v}",
                escape(job),
                escape(dataset)
            );
        }
    }
    out.push('\n');
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// CPU time, resident memory and threads of this process, from `/proc/self`.
#[derive(Debug, Clone, Copy)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub threads: u64,
}

/// `None` where `/proc` is not available.
pub fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    parse_proc(
        &stat,
        &statm,
        rustix::param::clock_ticks_per_second(),
        rustix::param::page_size() as u64,
    )
}

fn parse_proc(stat: &str, statm: &str, ticks: u64, page: u64) -> Option<ProcessStats> {
    // The command name (field 2) may contain spaces and parentheses: fields start after the
    // last ')'. There, index 0 is field 3 (state), so utime (14) is 11, stime (15) is 12 and
    // num_threads (20) is 17.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let threads: u64 = f.get(17)?.parse().ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks.max(1) as f64,
        rss_bytes: resident * page,
        threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files_with_odd_command_names() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 150 0 0 20 0 7 0 \
                    123 456789 321 18446744073709551615";
        let p = parse_proc(stat, "1000 321 50 10 0 200 0\n", 100, 4096).unwrap();
        assert!((p.cpu_seconds - 4.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.rss_bytes, 321 * 4096);
        assert_eq!(p.threads, 7);
        assert!(parse_proc("garbage", "", 100, 4096).is_none());
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let p = process_stats().expect("/proc/self is readable on linux");
        assert!(p.rss_bytes > 0 && p.threads >= 1, "{p:?}");
    }

    #[test]
    fn float_counters_render_labels_and_values() {
        let mut out = String::new();
        float_counter(&mut out, "x_seconds_total", "help", &[("j\"1", "d", 1.5)]);
        assert!(out.contains("# TYPE x_seconds_total counter\n"), "{out}");
        assert!(
            out.contains("x_seconds_total{job_name=\"j\\\"1\",dataset=\"d\"} 1.5\n"),
            "{out}"
        );
        let mut none = String::new();
        float_counter(&mut none, "y", "help", &[]);
        assert!(none.is_empty());
    }
}
