//! The daemon's stages of per-stage CPU accounting (`joader_stage_cpu_seconds_total`): those it
//! marks itself, and the list of all it reports, with the ones storage (`fetch`), the pipeline
//! and the actors mark (the mechanism is `joader-stages`).

use joader_stages::{RUNTIME, Stage};

/// The HTTP workers: connections, parsing, handlers, responses (less `metrics`).
pub static HTTP: Stage = Stage::new("http");
/// Rendering `/metrics` and sampling the dashboard's history.
pub static METRICS: Stage = Stage::new("metrics");

/// The daemon's stages, in the order the metrics list them.
pub static SERVER: [&Stage; 11] = [
    &actors::stages::READ,
    &joader_pipeline::DECODE,
    &joader_pipeline::RESIZE,
    &actors::stages::LOADER,
    &actors::stages::SLOT_WRITE,
    &actors::stages::CACHE,
    &actors::stages::SAMPLER,
    &HTTP,
    &METRICS,
    &joader_storage::stage::FETCH,
    &RUNTIME,
];

#[cfg(test)]
mod tests {
    use super::SERVER;

    #[test]
    fn the_server_and_client_lists_name_each_stage_once() {
        let mut names: Vec<&str> = SERVER
            .iter()
            .chain(dataplane::stages::CLIENT.iter())
            .map(|s| s.name())
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
