//! Rendering: the help text of every metric (`describe_all`) and the few counters the
//! exporter cannot hold (fractional seconds), written in the same text format after its
//! output.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use joader_storage::s3::{LATENCY_BUCKETS, ObjectStats, Op};
use joader_storage::tier::TierStats;

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Registers the help text and unit of every metric (once per recorder).
#[allow(
    clippy::too_many_lines,
    reason = "a table of help texts, one call per metric, read straight through"
)]
pub(super) fn describe_all() {
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
        "joader_loads_placed_total",
        "prepared elements a loader thread wrote straight into their shared-memory slot (the rest the cache copied in, when it had to make room first)"
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
        "joader_cache_reloads_total",
        "loads of elements evicted while a ring still had them queued (memory was short)"
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
        "prepared elements waiting for room because everything cached is held by rings or needed sooner"
    );
    describe_gauge!(
        "joader_cache_pending_loads",
        "elements rings need whose load waits for a free place (loads in flight are bounded)"
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
    describe_gauge!(
        "joader_parquet_budget_bytes",
        "what the reader of each parquet dataset keeps, by kind: decoded rows, row directories, small-field values in memory, and zstd or gzip row groups spilled to local disk"
    );
    describe_gauge!("joader_jobs", "registered jobs by state");
    describe_gauge!(
        "joader_cluster_nodes",
        "nodes registered with this leader, by state (alive, lost)"
    );
    describe_gauge!(
        "joader_cluster_generation",
        "this leader's generation: one more at each of its starts (a restart is a pause for multi-node jobs)"
    );
    describe_gauge!(
        "joader_cluster_jobs",
        "multi-node jobs of this leader by state (joining, running, restoring, finished, failed; ended ones for ten minutes)"
    );
    describe_counter!(
        "joader_cluster_placements_total",
        "samples of multi-node jobs this leader placed on a node and sent on its stream, by node"
    );
}

/// Appends the object-store stage's families (a server with `--allowed-s3` only). The
/// latency histogram is written here from the stage's atomic buckets.
pub(super) fn objects(out: &mut String, s: &ObjectStats) {
    requests(out, s);
    fetch_ahead(out, s);
    family(
        out,
        "joader_s3_get_seconds",
        "gauge",
        "a GET's time lately (smoothed over about 16): how far ahead the Sampler fetches",
        &[(vec![], s.get_time().map_or(0.0, |t| t.as_secs_f64()))],
    );
    latency(out, s);
}

/// The object-store requests: their number, bytes, retries, errors, waits and places.
fn requests(out: &mut String, s: &ObjectStats) {
    let requests: Vec<_> = Op::ALL
        .iter()
        .map(|op| {
            (
                vec![("op", op.as_str().to_string())],
                s.requests(*op) as f64,
            )
        })
        .collect();
    family(
        out,
        "joader_s3_requests_total",
        "counter",
        "requests to object stores (attempts, retries included), by operation: list (a page) or get",
        &requests,
    );
    family(
        out,
        "joader_s3_read_bytes_total",
        "counter",
        "body bytes received from object stores",
        &[(vec![], s.bytes.load(Relaxed) as f64)],
    );
    family(
        out,
        "joader_s3_retries_total",
        "counter",
        "object-store requests made again after a transient failure (5xx, 408, 429, connection, timeout)",
        &[(vec![], s.retries.load(Relaxed) as f64)],
    );
    family(
        out,
        "joader_s3_coalesced_requests_total",
        "counter",
        "ranged GETs that served several neighbouring tar members at once",
        &[(vec![], s.coalesced.load(Relaxed) as f64)],
    );
    let errors: Vec<_> = s
        .errors()
        .iter()
        .map(|(kind, n)| (vec![("kind", kind.to_string())], *n as f64))
        .collect();
    family(
        out,
        "joader_s3_errors_total",
        "counter",
        "failed object-store requests by kind (not_found, access_denied, refused: another 4xx, unavailable: 5xx or connection, timeout)",
        &errors,
    );
    family(
        out,
        "joader_s3_queued_seconds_total",
        "counter",
        "time element fetches waited for a place among the object-store requests in flight, summed",
        &[(vec![], s.queued_seconds())],
    );
    family(
        out,
        "joader_s3_in_flight_limit",
        "gauge",
        "object-store requests allowed in flight at once now (grows while fetches wait, halves when the store throttles; at most s3_max_in_flight)",
        &[(vec![], s.in_flight_limit() as f64)],
    );
    family(
        out,
        "joader_s3_in_flight",
        "gauge",
        "object-store requests in flight now",
        &[(vec![], s.in_flight() as f64)],
    );
}

/// The fetch-ahead buffer's counters and size.
fn fetch_ahead(out: &mut String, s: &ObjectStats) {
    let a = s.ahead();
    let ahead: [(&str, &str, &str, u64); 8] = [
        (
            "joader_s3_fetch_ahead_requests_total",
            "counter",
            "elements whose bytes were fetched ahead of their load (picked by the Sampler beyond what the Cache loads now)",
            a.requests,
        ),
        (
            "joader_s3_fetch_ahead_hits_total",
            "counter",
            "loads whose bytes were waiting in the fetch-ahead buffer",
            a.hits,
        ),
        (
            "joader_s3_fetch_ahead_joined_total",
            "counter",
            "loads whose bytes were on their way (they waited for that request instead of sending another)",
            a.joined,
        ),
        (
            "joader_s3_fetch_ahead_full_total",
            "counter",
            "elements not fetched ahead because the buffer was full (their loads fetched on demand)",
            a.full,
        ),
        (
            "joader_s3_fetch_ahead_failed_total",
            "counter",
            "fetches ahead that failed with no load waiting (the load fetched again)",
            a.failed,
        ),
        (
            "joader_s3_fetch_ahead_stale_total",
            "counter",
            "elements whose fetched bytes were dropped untaken (their job ended or was removed)",
            a.stale,
        ),
        (
            "joader_s3_fetch_ahead_bytes",
            "gauge",
            "bytes in the fetch-ahead buffer now (those on their way counted at the mean element size)",
            a.bytes,
        ),
        (
            "joader_s3_fetch_ahead_capacity_bytes",
            "gauge",
            "the fetch-ahead buffer's size (0: no fetch-ahead)",
            a.capacity,
        ),
    ];
    for (name, kind, help, v) in ahead {
        family(out, name, kind, help, &[(vec![], v as f64)]);
    }
}

/// The request latency histogram, from the stage's atomic buckets.
fn latency(out: &mut String, s: &ObjectStats) {
    let (buckets, count, sum) = s.latency();
    let name = "joader_s3_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} object-store request latency (one attempt)"
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (le, n) in LATENCY_BUCKETS.iter().zip(&buckets) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {count}\n");
}

/// A counter or gauge of the disk tier.
type TierField = fn(&TierStats) -> &std::sync::atomic::AtomicU64;

/// The disk tier's families but `dropped`: (name, type, help, field).
const DISK_CACHE: [(&str, &str, &str, TierField); 13] = [
    (
        "joader_disk_cache_queued",
        "gauge",
        "fetched objects queued for the disk tier's writer",
        |t| &t.queued,
    ),
    (
        "joader_disk_cache_capacity_bytes",
        "gauge",
        "the disk tier's size limit (0: no disk tier)",
        |t| &t.capacity,
    ),
    (
        "joader_disk_cache_bytes",
        "gauge",
        "bytes of the objects stored in the disk tier (headers included); never above its capacity",
        |t| &t.bytes,
    ),
    (
        "joader_disk_cache_objects",
        "gauge",
        "objects (elements' encoded bytes) stored in the disk tier",
        |t| &t.objects,
    ),
    (
        "joader_disk_cache_writing",
        "gauge",
        "1 while the disk tier writes, 0 once a write error stopped it",
        |t| &t.writing,
    ),
    (
        "joader_disk_cache_hits_total",
        "counter",
        "element reads served from the disk tier instead of the object store",
        |t| &t.hits,
    ),
    (
        "joader_disk_cache_misses_total",
        "counter",
        "element reads the disk tier did not serve (not stored, damaged or unreadable): fetched from the store",
        |t| &t.misses,
    ),
    (
        "joader_disk_cache_writes_total",
        "counter",
        "objects written to the disk tier",
        |t| &t.writes,
    ),
    (
        "joader_disk_cache_written_bytes_total",
        "counter",
        "bytes written to the disk tier",
        |t| &t.written_bytes,
    ),
    (
        "joader_disk_cache_evictions_total",
        "counter",
        "objects evicted from the disk tier to admit others (only objects no active job still needs this epoch)",
        |t| &t.evictions,
    ),
    (
        "joader_disk_cache_not_admitted_total",
        "counter",
        "fetched objects not stored: every stored object was still needed by a job this epoch",
        |t| &t.not_admitted,
    ),
    (
        "joader_disk_cache_write_errors_total",
        "counter",
        "failed writes to the disk tier (the first stops writing; jobs are not affected)",
        |t| &t.write_errors,
    ),
    (
        "joader_disk_cache_corrupt_total",
        "counter",
        "stored objects found torn or failing their checksum, dropped and fetched again",
        |t| &t.corrupt,
    ),
];

/// The disk tier's families (`joader_disk_cache_*`): written by every server, zeros where
/// there is no tier (`--disk-cache`), so that dashboards find them everywhere.
pub(super) fn disk_cache(out: &mut String, t: Option<&TierStats>) {
    let v = |f: TierField| [(vec![], t.map_or(0.0, |t| f(t).load(Relaxed) as f64))];
    for (name, kind, help, f) in DISK_CACHE {
        family(out, name, kind, help, &v(f));
    }
    family(
        out,
        "joader_disk_cache_dropped_total",
        "counter",
        "fetched objects not offered to the disk tier's writer: its queue was full",
        &v(|t| &t.dropped),
    );
}

/// Appends one metric family in the Prometheus text format: `rows` of (labels, value);
/// a family without rows is not written.
pub(super) fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, f64)],
) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in rows {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = writeln!(out, "{name}{{{}}} {v}", l.join(","));
        }
    }
    out.push('\n');
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_labels_and_values() {
        let mut out = String::new();
        let rows = vec![(
            vec![("job_name", "j\"1".to_string()), ("dataset", "d".into())],
            1.5,
        )];
        family(&mut out, "x_seconds_total", "counter", "help", &rows);
        assert!(out.contains("# TYPE x_seconds_total counter\n"), "{out}");
        assert!(
            out.contains("x_seconds_total{job_name=\"j\\\"1\",dataset=\"d\"} 1.5\n"),
            "{out}"
        );
        let mut plain = String::new();
        family(&mut plain, "y", "gauge", "help", &[(vec![], 2.0)]);
        assert!(plain.contains("\ny 2\n"), "{plain}");
        let mut none = String::new();
        family(&mut none, "z", "gauge", "help", &[]);
        assert!(none.is_empty());
    }
}
