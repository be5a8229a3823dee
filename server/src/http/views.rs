//! The JSON views of the registry that responses carry (and the dashboard reads).

use std::sync::atomic::Ordering::Relaxed;

use actors::service::JobState;
use joader_core::sampling::SamplerKind;
use serde_json::json;

use crate::registry::{AppState, DatasetEntry, JobEntry};

pub fn dataset_json(d: &DatasetEntry) -> serde_json::Value {
    let index = d.index.as_ref();
    json!({
        "name": d.record.name,
        "source": d.record.source,
        "state": d.record.state,
        "error": d.record.error,
        "progress": d.progress.load(Relaxed),
        "items": index.map(|i| i.len()),
        "index_bytes": index.map(|i| i.heap_bytes()),
        "classes": index.map(|i| i.classes()),
        "created_unix": d.record.created_unix,
    })
}

pub fn job_json(j: &JobEntry) -> serde_json::Value {
    let s = &j.stats;
    let state = s.state();
    let (state_name, reason) = match &state {
        JobState::Waiting => ("waiting", None),
        JobState::Running => ("running", None),
        JobState::Finished => ("finished", None),
        JobState::Failed(r) => ("failed", Some(r.clone())),
    };
    json!({
        "name": j.name,
        "dataset": j.dataset,
        "state": state_name,
        "reason": reason,
        "epoch": s.epoch.load(Relaxed),
        "position": s.position.load(Relaxed),
        "subset_size": j.subset_len,
        "sampled": s.sampled.load(Relaxed),
        "delivered": s.delivered.load(Relaxed),
        "acknowledged": s.acknowledged.load(Relaxed),
        "samples_per_s": j.rate(),
        "hits": s.hits.load(Relaxed),
        "misses": s.misses.load(Relaxed),
        "hit_ratio": s.hit_ratio(),
        "errors": s.errors.load(Relaxed),
        "stall_s": s.stall_us.load(Relaxed) as f64 / 1e6,
        "batch_size": j.request.batch_size,
        "seed": j.request.seed,
        "world_size": j.request.world_size.unwrap_or(1),
        "epochs": j.request.epochs,
        "drop_last": j.request.drop_last,
        "sampler": j.request.sampler.unwrap_or(SamplerKind::Dsa).name(),
        "pipeline": j.pipeline,
        "age_s": j.created.elapsed().as_secs_f64(),
    })
}

pub fn registration_json(state: &AppState, j: &JobEntry) -> serde_json::Value {
    let ranks: Vec<_> = j
        .rings
        .iter()
        .map(|r| {
            json!({
                "rank": r.rank,
                "instance": state.config.instance,
                "data_segment": dataplane::names::data_segment(&state.config.instance),
                "ring": r.ring,
                "ring_segment": r.segment,
                "reader_index": r.reader_index,
                "capacity": r.capacity,
            })
        })
        .collect();
    json!({ "job": job_json(j), "layout_version": dataplane::LAYOUT_VERSION, "ranks": ranks })
}

/// `GET /v1/stats`: the cache, the loader, the sampler and the process.
pub fn stats_json(state: &AppState) -> serde_json::Value {
    let s = &state.stats;
    let requests = s.requests.load(Relaxed);
    let hits = s.hits.load(Relaxed);
    let rounds_el = s.round_elements.load(Relaxed);
    let process = crate::procstat::process_stats();
    json!({
        "instance": state.config.instance,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": state.started.elapsed().as_secs_f64(),
        "requests": requests,
        "hits": hits,
        "misses": s.misses.load(Relaxed),
        "hit_ratio": if requests == 0 { 0.0 } else { hits as f64 / requests as f64 },
        "loads": s.loads.load(Relaxed),
        "decodes": s.decodes.load(Relaxed),
        // Deliveries served without a read and preparation of their own (as the metric
        // `joader_decodes_saved_total`).
        "decodes_saved": hits,
        "bytes_read": s.bytes_read.load(Relaxed),
        "load_errors": s.load_errors.load(Relaxed),
        "evictions": s.evictions.load(Relaxed),
        "evictions_unneeded": s.evictions_unneeded.load(Relaxed),
        "evictions_needed": s.evictions_needed.load(Relaxed),
        "reloads": s.reloads.load(Relaxed),
        "slots_in_use": s.slots_in_use.load(Relaxed),
        "slot_capacity": s.slot_capacity.load(Relaxed),
        "bytes_in_use": s.bytes_in_use.load(Relaxed),
        "capacity_bytes": s.capacity_bytes.load(Relaxed),
        "waiting_for_space": s.waiting_for_space.load(Relaxed),
        "pending_loads": s.pending_loads.load(Relaxed),
        "loader_queue": s.loader_queue.load(Relaxed),
        "loader_busy_s": s.loader_busy_us.load(Relaxed) as f64 / 1e6,
        "rounds": s.rounds.load(Relaxed),
        "mean_share": if rounds_el == 0 { 0.0 } else { s.round_deliveries.load(Relaxed) as f64 / rounds_el as f64 },
        "loader_workers": state.config.loader_workers.max(1),
        "process_cpu_s": process.map(|p| p.cpu_seconds),
        "process_rss_bytes": process.map(|p| p.rss_bytes),
        "process_threads": process.map(|p| p.threads),
    })
}
