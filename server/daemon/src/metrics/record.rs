//! Recording: copies the counters the actors keep in atomics (`CacheStats`, every job's
//! `JobStats`) into the server's recorder at scrape time, and records HTTP requests as they
//! happen. Nothing here formats text; `render` does.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use actors::JobState;
use joader_storage::ParquetReads;
use metrics::{counter, gauge};

use crate::procstat::process_stats;
use crate::registry::{DatasetEntry, JobCounts, JobEntry, Retired};
use crate::state::AppState;

/// Kinds of element failures (`StorageError::code`, `PipelineError::code`) seen in practice.
pub(super) const COMMON_FAILURE_KINDS: [&str; 6] = [
    "read_failed",
    "not_found",
    "not_an_image",
    "corrupt_image",
    "image_too_large",
    "unsupported_image",
];

/// Job states exported by `joader_jobs` (each scrape sets all of them, zeros included).
pub(super) const JOB_STATES: [&str; 4] = ["waiting", "running", "finished", "failed"];

/// The per-job integer counters: (name, help, the counter of [`JobCounts`] it reports).
type Count = fn(&JobCounts) -> u64;
pub(super) const JOB_COUNTERS: [(&str, &str, Count); 9] = [
    (
        "joader_job_sampled_total",
        "deliveries the sampler decided for the job",
        |c| c.sampled,
    ),
    (
        "joader_ring_pushed_total",
        "records pushed into the job's delivery rings (data and error records)",
        |c| c.pushed,
    ),
    (
        "joader_ring_popped_total",
        "records the job's client took from its rings and acknowledged (ring occupancy = pushed - popped)",
        |c| c.acknowledged,
    ),
    (
        "joader_job_delivered_samples_total",
        "samples the job's client received and acknowledged",
        |c| c.acknowledged,
    ),
    (
        "joader_job_hits_total",
        "deliveries to the job served by a cached slot or another job's load in flight",
        |c| c.hits,
    ),
    (
        "joader_job_misses_total",
        "deliveries to the job that needed a load of their own",
        |c| c.misses,
    ),
    (
        "joader_job_errors_total",
        "elements that failed to load, delivered to the job as error records",
        |c| c.errors,
    ),
    (
        "joader_job_waits_for_others_total",
        "times a unit (a rank's next batch) of the job waited for cache room other jobs held (records they had not acknowledged, elements they needed sooner) while its client had taken everything and had credit; zero while the cache holds two batches per reading rank",
        |c| c.waited_for_others,
    ),
    (
        "joader_job_store_read_bytes_total",
        "bytes object stores sent for the loads the job's misses issued (a load shared with other jobs counts for the job whose miss issued it)",
        |c| c.store_read_bytes,
    ),
];

/// What the exporter remembers of a job name between scrapes.
///
/// A job name can be reused once its job finished or failed, and the new job's counters
/// start at zero. Prometheus counters must not go down, so the series of a name continues
/// from what the stopped jobs of that name counted (`Registry::jobs_and_retired`), and never
/// goes down. A name with neither a job nor retired counters (the registry forgets them after
/// `metrics_retention_s`) is dropped here too: its series end.
pub(super) struct JobSeries {
    dataset: String,
    counts: JobCounts,
    stall: f64,
}

/// The per-job and per-dataset families, rendered by `render::family` (not through the
/// recorder, which never forgets a series: these must end when their job or dataset is gone).
#[derive(Default)]
pub(super) struct Labelled {
    pub families: Vec<Family>,
}

/// One family: (name, type, help, rows of (labels, value)).
pub(super) type Family = (&'static str, &'static str, &'static str, Vec<(Labels, f64)>);

/// Label pairs of one series.
pub(super) type Labels = Vec<(&'static str, String)>;

/// Help texts of the per-job gauges, in the order `record_jobs` fills them.
const JOB_GAUGES: [(&str, &str); 6] = [
    ("joader_job_epoch", "the job's current epoch"),
    (
        "joader_job_epoch_position",
        "position of the last sampled element in the job's epoch",
    ),
    ("joader_job_subset_size", "elements in the job's subset"),
    (
        "joader_job_samples_per_second",
        "samples per second the job's client acknowledged, over the last second or so while \
         it runs, over its whole run once it has ended",
    ),
    (
        "joader_job_run_samples_per_second",
        "the job's mean samples per second over its run: acknowledged over the time from its \
         first credit to its last acknowledgement (to now while it runs)",
    ),
    ("joader_job_running", "1 while the job runs"),
];

/// What the reader of each `parquet` dataset keeps, as configured.
fn record_parquet_budgets(state: &AppState) {
    let budgets = state.registry.config().parquet_budgets();
    for (kind, bytes) in [
        ("decoded", budgets.decoded),
        ("directories", budgets.directories),
        ("fields", budgets.fields),
        (
            "spill",
            joader_storage::ParquetSpill::current().map_or(0, |s| s.bytes as usize),
        ),
    ] {
        gauge!("joader_parquet_budget_bytes", "kind" => kind).set(bytes as f64);
    }
}

/// The counters of a `parquet` dataset's reads, in the order of `ParquetReads`' fields below.
type ParquetField = fn(&ParquetReads) -> u64;
const PARQUET_COUNTERS: [(&str, &str, ParquetField); 9] = [
    (
        "joader_parquet_rows_read_total",
        "rows of a parquet dataset read (an image's bytes returned)",
        |r| r.rows,
    ),
    (
        "joader_parquet_read_bytes_total",
        "bytes a parquet dataset's reads took from its files (a row group's column chunk on its first read, a row's piece after)",
        |r| r.bytes_read,
    ),
    (
        "joader_parquet_decompressed_bytes_total",
        "bytes a parquet dataset's reads decompressed (whole pages on a group's first read, a row's piece after)",
        |r| r.bytes_decompressed,
    ),
    (
        "joader_parquet_row_groups_decoded_total",
        "row groups of a parquet dataset decoded whole",
        |r| r.groups_decoded,
    ),
    (
        "joader_parquet_decoded_row_hits_total",
        "rows of a parquet dataset served from the decoded rows kept (joader_parquet_budget_bytes{kind=\"decoded\"})",
        |r| r.decoded_hits,
    ),
    (
        "joader_parquet_field_groups_total",
        "row groups' small-field columns of a parquet dataset read whole (once while their values are kept)",
        |r| r.field_groups,
    ),
    (
        "joader_parquet_field_hits_total",
        "small-field values of a parquet dataset served from the row groups' values kept (joader_parquet_budget_bytes{kind=\"fields\"})",
        |r| r.field_hits,
    ),
    (
        "joader_parquet_spilled_groups_total",
        "zstd and gzip row groups of a parquet dataset spilled decoded to local disk (joader_parquet_budget_bytes{kind=\"spill\"})",
        |r| r.spilled_groups,
    ),
    (
        "joader_parquet_spill_hits_total",
        "rows of a parquet dataset read from a spilled row group (one read of the row's bytes)",
        |r| r.spill_hits,
    ),
];

/// Every job's and dataset's series (the series of a reused name continue from its stopped
/// jobs), and the jobs-by-state gauge into the recorder. Forgets the series of names the
/// registry no longer knows.
pub(super) fn record_jobs(jobs: &Mutex<BTreeMap<String, JobSeries>>, state: &AppState) -> Labelled {
    let mut out = Labelled::default();
    let Ok(mut series) = jobs.lock() else {
        return out;
    };
    dataset_families(&state.registry.datasets(), &mut out);
    let (jobs, retired) = state.registry.jobs_and_retired();
    let by_state = job_families(&mut series, &jobs, &retired, &mut out);
    for (st, n) in by_state {
        gauge!("joader_jobs", "state" => st).set(n as f64);
    }
    out
}

/// The datasets' items, and what the reads of each `parquet` dataset cost (a re-indexed
/// dataset counts anew).
fn dataset_families(datasets: &[DatasetEntry], out: &mut Labelled) {
    let items = datasets
        .iter()
        .map(|d| {
            let n = d.index.as_ref().map_or(0, |i| i.len());
            (vec![("dataset", d.record.name.clone())], n as f64)
        })
        .collect();
    out.families.push((
        "joader_dataset_items",
        "gauge",
        "items indexed in the dataset",
        items,
    ));
    preload_families(datasets, out);
    let reads: Vec<(String, ParquetReads)> = datasets
        .iter()
        .filter_map(|d| Some((d.record.name.clone(), d.index.as_ref()?.parquet_reads()?)))
        .collect();
    for (name, help, field) in PARQUET_COUNTERS {
        let rows = reads
            .iter()
            .map(|(d, r)| (vec![("dataset", d.clone())], field(r) as f64))
            .collect();
        out.families.push((name, "counter", help, rows));
    }
    let spilled = reads
        .iter()
        .map(|(d, r)| (vec![("dataset", d.clone())], r.spill_bytes as f64))
        .collect();
    out.families.push((
        "joader_parquet_spill_bytes",
        "gauge",
        "bytes a parquet dataset's spilled row groups take on local disk now",
        spilled,
    ));
}

/// Each dataset's preload: its elements by kind, and the bytes it pins.
fn preload_families(datasets: &[DatasetEntry], out: &mut Labelled) {
    let preloads: Vec<(&str, &actors::PreloadProgress)> = datasets
        .iter()
        .filter_map(|d| Some((d.record.name.as_str(), &*d.preload.as_ref()?.progress)))
        .collect();
    let mut elements = Vec::new();
    for (name, p) in &preloads {
        for (kind, v) in [
            ("total", &p.elements),
            ("pinned", &p.pinned),
            ("failed", &p.failed),
        ] {
            let labels = vec![("dataset", (*name).to_owned()), ("kind", kind.to_owned())];
            elements.push((labels, v.load(Relaxed) as f64));
        }
    }
    out.families.push((
        "joader_preload_elements",
        "gauge",
        "elements of the dataset's preloaded working set: its total, those pinned in the cache, those that failed to load",
        elements,
    ));
    let bytes = preloads
        .iter()
        .map(|(name, p)| {
            let labels = vec![("dataset", (*name).to_owned())];
            (labels, p.pinned_bytes.load(Relaxed) as f64)
        })
        .collect();
    out.families.push((
        "joader_preload_pinned_bytes",
        "gauge",
        "bytes the dataset's preloaded working set pins in the cache (every preload together: at most half of it)",
        bytes,
    ));
}

/// The state label of a job.
fn state_name(j: &JobEntry) -> &'static str {
    match j.stats.state() {
        JobState::Waiting => "waiting",
        JobState::Running => "running",
        JobState::Finished => "finished",
        JobState::Failed(_) => "failed",
    }
}

/// The per-job counters and gauges; returns how many jobs are in each state.
fn job_families(
    series: &mut BTreeMap<String, JobSeries>,
    jobs: &[Arc<JobEntry>],
    retired: &BTreeMap<String, Retired>,
    out: &mut Labelled,
) -> BTreeMap<&'static str, u64> {
    let mut by_state: BTreeMap<&str, u64> = JOB_STATES.iter().map(|s| (*s, 0)).collect();
    let mut gauges: [Vec<(Labels, f64)>; 6] = Default::default();
    for j in jobs {
        let st = state_name(j);
        *by_state.entry(st).or_default() += 1;
        continue_series(series, j, retired.get(&j.name).copied().unwrap_or_default());
        let s = &j.stats;
        let values = [
            s.epoch.load(Relaxed) as f64,
            s.position.load(Relaxed) as f64,
            j.subset_len.load(Relaxed) as f64,
            j.rate().0,
            s.run_rate(!j.has_ended()),
            f64::from(u8::from(st == "running")),
        ];
        for (g, v) in gauges.iter_mut().zip(values) {
            g.push((job_labels(&j.name, &j.dataset), v));
        }
    }
    // Names with neither a job nor retired counters are forgotten; the others that have no
    // job no longer run.
    // (A set: a scrape stays linear in the jobs and names the registry keeps.)
    let known: std::collections::BTreeSet<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    series.retain(|name, _| known.contains(name.as_str()) || retired.contains_key(name));
    for (name, e) in series
        .iter()
        .filter(|(name, _)| !known.contains(name.as_str()))
    {
        gauges[3].push((job_labels(name, &e.dataset), 0.0));
        gauges[4].push((job_labels(name, &e.dataset), 0.0));
    }
    series_families(series, out);
    for ((metric, help), rows) in JOB_GAUGES.iter().zip(gauges) {
        out.families.push((metric, "gauge", help, rows));
    }
    by_state
}

fn job_labels(name: &str, dataset: &str) -> Labels {
    vec![
        ("job_name", name.to_owned()),
        ("dataset", dataset.to_owned()),
    ]
}

/// Advances a job's series: a job under a reused name continues from what the stopped ones
/// of that name counted (recorded when they stopped, so no scrape can miss it), and no
/// counter goes down.
fn continue_series(series: &mut BTreeMap<String, JobSeries>, j: &JobEntry, retired: Retired) {
    let e = series.entry(j.name.clone()).or_insert_with(|| JobSeries {
        dataset: j.dataset.clone(),
        counts: JobCounts::default(),
        stall: 0.0,
    });
    e.dataset = j.dataset.clone();
    let total = retired
        .counts
        .zip_with(JobCounts::of(&j.stats), u64::saturating_add);
    e.counts = e.counts.zip_with(total, u64::max);
    e.stall = e
        .stall
        .max(retired.stall_s + j.stats.stall_us.load(Relaxed) as f64 / 1e6);
}

/// The job counters and the stall time of every remembered name.
fn series_families(series: &BTreeMap<String, JobSeries>, out: &mut Labelled) {
    for (metric, help, count) in JOB_COUNTERS {
        let rows = series
            .iter()
            .map(|(name, e)| (job_labels(name, &e.dataset), count(&e.counts) as f64))
            .collect();
        out.families.push((metric, "counter", help, rows));
    }
    let stalls = series
        .iter()
        .map(|(name, e)| (job_labels(name, &e.dataset), e.stall))
        .collect();
    out.families.push((
        "joader_job_stall_seconds_total",
        "counter",
        "time the job's ring sat empty while its client was attached and had credit (sampled at every cache tick, summed over ranks)",
        stalls,
    ));
}

/// The number of job names the exporter remembers (for the state-size report).
pub(super) fn series_len(jobs: &Mutex<BTreeMap<String, JobSeries>>) -> usize {
    jobs.lock().map_or(0, |s| s.len())
}

pub(super) fn histogram_http(method: &str, route: &str, secs: f64) {
    metrics::histogram!("joader_http_request_duration_seconds",
        "method" => method.to_string(), "route" => route.to_string())
    .record(secs);
}

/// Copies the cache's, the loader's, the sampler's and the process's figures into the recorder.
pub(super) fn record_cache(state: &AppState) {
    let s = &state.registry.stats();
    let c = |name: &'static str, v: u64| counter!(name).absolute(v);
    c("joader_cache_requests_total", s.requests.load(Relaxed));
    c("joader_cache_hits_total", s.hits.load(Relaxed));
    c("joader_cache_misses_total", s.misses.load(Relaxed));
    c("joader_decodes_saved_total", s.hits.load(Relaxed));
    c("joader_loads_total", s.loads.load(Relaxed));
    c("joader_decodes_total", s.decodes.load(Relaxed));
    c("joader_loads_placed_total", s.placed.load(Relaxed));
    c(
        "joader_storage_read_bytes_total",
        s.bytes_read.load(Relaxed),
    );
    c("joader_load_errors_total", s.load_errors.load(Relaxed));
    counter!("joader_cache_evictions_total", "reason" => "unneeded")
        .absolute(s.evictions_unneeded.load(Relaxed));
    counter!("joader_cache_evictions_total", "reason" => "needed")
        .absolute(s.evictions_needed.load(Relaxed));
    c("joader_cache_reloads_total", s.reloads.load(Relaxed));
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
        "joader_cache_pending_loads",
        s.pending_loads.load(Relaxed) as f64,
    );
    g(
        "joader_loader_queue_depth",
        s.loader_queue.load(Relaxed) as f64,
    );
    g(
        "joader_loader_workers",
        state.registry.config().loader_workers.max(1) as f64,
    );
    g(
        "joader_uptime_seconds",
        state.registry.uptime().as_secs_f64(),
    );
    if let Some(p) = process_stats() {
        g("joader_process_resident_memory_bytes", p.rss_bytes as f64);
        g("joader_process_threads", p.threads as f64);
    }
    record_parquet_budgets(state);
    gauge!("joader_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    if let Some(leader) = &state.leader {
        leader.record_metrics();
    }
}
