//! The report of `joader bench e2e`: a markdown table and a PNG chart.

use std::path::Path;

use anyhow::Result;

use super::scenarios::Scenario;
use super::systems::{CachedStep, Outcome, TORCH, TORCH_CORES_PER_JOB};

/// The baselines: a ratio against one of them is checked against what sharing allows.
const BASELINES: [&str; 3] = ["independent", TORCH, TORCH_CORES_PER_JOB];

/// The scenario whose aggregates are each system's K = 1 reference.
const K1: &str = "sync K=1";

pub(super) fn markdown(
    rows: &[(Scenario, Vec<Outcome>)],
    workers: usize,
    cache_bytes: u64,
    decoded_bytes: u64,
    n: u32,
) -> String {
    let cache = bytesize::ByteSize(cache_bytes).display().iec();
    let decoded = bytesize::ByteSize(decoded_bytes).display().iec();
    let mut s = format!(
        "joader bench e2e: {n} images 500x375 -> decode, resize 256 (cached), per job RandomResizedCrop 224 + flip; \
         {workers} decode threads; cache {cache} = {:.0}% of the decoded dataset ({decoded}: the {n} images decoded and resized in this run)\n\n\
         Every job is timed from its start (joader and python: its registration; independent: its first task; pytorch: iter(), which starts its workers; \
         processes after their imports) to its last sample. samples/s (all jobs): every sample over the span from the first job's start to the last sample; \
         per job: each job's samples over its own span; from first batch: the samples after each job's first batch, from the end of the first of those batches \
         to the last sample; start-up s: the mean time from a job's start to the end of its first batch. CPU is over the whole span (start-up included) per sample. \
         vs X: this row's samples/s (all jobs) or CPU ms/sample over X's in the same scenario. sharing vs pytorch: (this row / this system at {K1}) over \
         (pytorch / pytorch at {K1}), the throughput ratio with each system's K=1 lead taken out. pytorch: cores/K workers per job (at least 1); \
         {TORCH_CORES_PER_JOB}: {workers} workers per job.\n\n\
         | scenario | system | samples/s (all jobs) | per job samples/s | CPU ms/sample | decodes/sample | samples/s from first batch | start-up s | hit ratio | \
         throughput vs independent | CPU vs independent | throughput vs pytorch | sharing vs pytorch | CPU vs pytorch | wait in next() after the first batch |\n\
         |---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        cache_bytes as f64 * 100.0 / decoded_bytes.max(1) as f64,
    );
    for (sc, outs) in rows {
        for o in outs {
            let per: Vec<String> = o.per_job.iter().map(|r| format!("{r:.0}")).collect();
            let [(tr, cr), (tp, cp)] = ["independent", TORCH].map(|b| ratios(o, outs, b));
            let share = sharing(rows, sc, o, TORCH).map_or("-".into(), |r| format!("{r:.2}x"));
            s.push_str(&format!(
                "| {} | {} | {:.0} | {} | {:.2} | {:.2} | {:.0} | {:.2} | {} | {tr} | {cr} | {tp} | {share} | {cp} | {} |\n",
                sc.name,
                o.system,
                o.aggregate,
                per.join(" / "),
                o.cpu_ms_per_sample,
                o.decodes_per_sample,
                o.from_first,
                o.startup_s,
                o.hit_ratio
                    .map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
                o.wait_frac
                    .map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
            ));
        }
    }
    s
}

/// The aggregate of `system` in the scenario named `name`.
fn aggregate(rows: &[(Scenario, Vec<Outcome>)], name: &str, system: &str) -> Option<f64> {
    let (_, outs) = rows.iter().find(|(sc, _)| sc.name == name)?;
    Some(outs.iter().find(|o| o.system == system)?.aggregate)
}

/// Whether every job of `sc` has a training step: the step sets the pace, and ratios between
/// systems measure how well each overlaps loading with it, not sharing.
fn all_step(sc: &Scenario) -> bool {
    sc.jobs.iter().all(|j| j.sleep_ms > 0.0)
}

/// (o here / o at K=1) over (base here / base at K=1): the throughput ratio of `o` against
/// `base` with both systems' K=1 figures taken out, so that what is left is what K jobs gain
/// together (sharing) against what the baseline gains or loses with K jobs.
fn sharing(
    rows: &[(Scenario, Vec<Outcome>)],
    sc: &Scenario,
    o: &Outcome,
    base: &str,
) -> Option<f64> {
    if all_step(sc) {
        return None;
    }
    let b = aggregate(rows, &sc.name, base)?;
    let (o1, b1) = (aggregate(rows, K1, o.system)?, aggregate(rows, K1, base)?);
    Some((o.aggregate / o1.max(1e-9)) / (b / b1.max(1e-9)).max(1e-9))
}

/// Throughput and CPU ratios of `o` against the system `base` of the same scenario ("-" where
/// `base` did not run or measured nothing).
fn ratios(o: &Outcome, outs: &[Outcome], base: &str) -> (String, String) {
    let ratio = |x: f64, y: f64| {
        if y > 0.0 {
            format!("{:.2}x", x / y)
        } else {
            "-".into()
        }
    };
    outs.iter().find(|b| b.system == base).map_or_else(
        || ("-".into(), "-".into()),
        |b| {
            (
                ratio(o.aggregate, b.aggregate),
                ratio(o.cpu_ms_per_sample, b.cpu_ms_per_sample),
            )
        },
    )
}

/// The training loop from cache, as a small table of its own.
pub(super) fn cached_step(c: &CachedStep) -> String {
    let cache = bytesize::ByteSize(c.cache_bytes).display().iec();
    format!(
        "\nTraining loop from cache: the Python client, one job over the {} images, batches of {}, \
         a {:.0} ms sleep per batch standing for the GPU step; epoch 1 fills a {cache} cache, epoch 2 is timed.\n\n\
         | cached step {:.0} ms/{} | measured | target |\n|---|---:|---:|\n\
         | wait in next() / loop time | {:.1}% ({:.3} s of {:.2} s, {} samples) | <= 5% |\n\
         | server decodes per image over both epochs | {:.2} | 1.00 |\n\
         | client CPU ms/sample in epoch 2 | {:.3} | |\n",
        c.images,
        c.batch,
        c.step_ms,
        c.step_ms,
        c.batch,
        c.wait_s * 100.0 / c.loop_s.max(1e-9),
        c.wait_s,
        c.loop_s,
        c.samples,
        c.decodes_per_image,
        c.client_cpu_ms,
    )
}

/// joader's CPU by stage in each scenario (the in-process server and its consumer threads:
/// `dataplane::stages`), in ms per sample, beside the process's CPU per sample: what the
/// stages do not cover is the bench's own threads.
pub(super) fn stages(rows: &[(Scenario, Vec<Outcome>)]) -> String {
    let Some(names) = rows
        .iter()
        .flat_map(|(_, outs)| outs)
        .find(|o| !o.stages.is_empty())
        .map(|o| o.stages.iter().map(|(n, _)| *n).collect::<Vec<_>>())
    else {
        return String::new();
    };
    let mut s = format!(
        "\njoader's CPU by stage, ms per sample (the in-process server and the consumer threads; \
         `runtime` includes the consumers' reads):\n\n| scenario | process CPU | stages sum | {} |\n|---|---:|---:|{}\n",
        names.join(" | "),
        "---:|".repeat(names.len())
    );
    for (sc, outs) in rows {
        for o in outs.iter().filter(|o| !o.stages.is_empty()) {
            let per = |v: f64| v * 1e3 / o.samples.max(1) as f64;
            let sum: f64 = o.stages.iter().map(|(_, v)| v).sum();
            let cells: Vec<String> = o
                .stages
                .iter()
                .map(|(_, v)| format!("{:.3}", per(*v)))
                .collect();
            s.push_str(&format!(
                "| {} | {:.3} | {:.3} | {} |\n",
                sc.name,
                o.cpu_ms_per_sample,
                per(sum),
                cells.join(" | ")
            ));
        }
    }
    s
}

/// Each baseline's aggregate over the synchronous scenarios (K = 1, 2, …): independent
/// loading and the tuned PyTorch have the same threads at every K, so on a decode-bound
/// machine they must stay flat; PyTorch with workers = cores per job has K × cores workers.
pub(super) fn baselines_by_k(rows: &[(Scenario, Vec<Outcome>)]) -> String {
    let mut s = String::new();
    for (base, label) in [
        ("independent", "Independent loading".to_string()),
        (TORCH, format!("PyTorch ({TORCH})")),
        (
            TORCH_CORES_PER_JOB,
            format!("PyTorch ({TORCH_CORES_PER_JOB})"),
        ),
    ] {
        let by_k: Vec<(usize, f64)> = rows
            .iter()
            .filter(|(sc, _)| sc.name.starts_with("sync K="))
            .filter_map(|(sc, outs)| {
                let o = outs.iter().find(|o| o.system == base)?;
                Some((sc.jobs.len(), o.aggregate))
            })
            .collect();
        let Some(&(_, first)) = by_k.first() else {
            continue;
        };
        let cells: Vec<String> = by_k
            .iter()
            .map(|(k, a)| format!("K={k} {a:.0}/s ({:.2}x)", a / first.max(1e-9)))
            .collect();
        s.push_str(&format!(
            "\n{label}, aggregate by K (vs K=1): {}\n",
            cells.join(", ")
        ));
    }
    s
}

/// A ratio against a baseline beyond what sharing allows. K jobs sharing can make a system
/// at most K times faster than alone, so against a baseline that keeps its pace its ratio can
/// reach K times the ratio measured at K = 1 (the lead of one job alone: its decoder, its
/// resize, its threads), not more; above that, the baseline lost throughput of its own with K
/// jobs (oversubscribed, or disturbed in this run), or the system's K = 1 run was slow: the
/// warning gives both factors. Without a K = 1 run, a ratio above K against independent
/// loading (no faster than joader alone: the same code on the same threads) is flagged. Where
/// every job has a training step the step sets the pace: no warning there.
pub(super) fn warnings(rows: &[(Scenario, Vec<Outcome>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (sc, outs) in rows {
        if all_step(sc) {
            continue;
        }
        let k = sc.jobs.len() as f64;
        for b in outs.iter().filter(|b| BASELINES.contains(&b.system)) {
            for o in outs.iter().filter(|o| o.system != b.system) {
                let r = o.aggregate / b.aggregate.max(1e-9);
                let k1 = (aggregate(rows, K1, o.system), aggregate(rows, K1, b.system));
                match k1 {
                    (Some(o1), Some(b1)) => {
                        let lead = o1 / b1.max(1e-9);
                        if r > k * lead * 1.05 {
                            out.push(format!(
                                "{}: {} is {r:.2}x {} with {k} job(s), above {k} x its {K1} ratio {lead:.2}x = {:.2}x that sharing allows: \
                                 {} here / at K=1 = {:.2}x (sharing gives at most {k}x), {} here / at K=1 = {:.2}x; \
                                 the baseline lost throughput of its own (oversubscribed, or disturbed in this run), or the K=1 run was slow",
                                sc.name,
                                o.system,
                                b.system,
                                k * lead,
                                o.system,
                                o.aggregate / o1.max(1e-9),
                                b.system,
                                b.aggregate / b1.max(1e-9),
                            ));
                        }
                    }
                    _ if b.system == "independent" && r > k * 1.05 => out.push(format!(
                        "{}: {} is {r:.2}x {} with {k} job(s), above the {k}x that sharing allows; that baseline was disturbed in this run",
                        sc.name, o.system, b.system
                    )),
                    _ => {}
                }
            }
        }
    }
    out
}

pub(super) fn chart(rows: &[(Scenario, Vec<Outcome>)], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    crate::bench::chart_font()?;
    let systems: Vec<&str> = rows
        .first()
        .map(|r| r.1.iter().map(|o| o.system).collect())
        .unwrap_or_default();
    let max = rows
        .iter()
        .flat_map(|r| r.1.iter().map(|o| o.aggregate))
        .fold(1.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "samples/s of all jobs, from each job's start to the last sample",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..max)?;
    let names: Vec<String> = rows.iter().map(|r| r.0.name.clone()).collect();
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 12).into_font())
        .y_desc("samples/s")
        .draw()?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(44, 160, 44),
        RGBColor(152, 223, 138),
        RGBColor(214, 39, 40),
        RGBColor(140, 86, 75),
        RGBColor(127, 127, 127),
    ];
    let w = 0.8 / systems.len().max(1) as f64;
    for (si, sys) in systems.iter().enumerate() {
        let color = palette[si % palette.len()];
        c.draw_series(rows.iter().enumerate().filter_map(|(i, r)| {
            let o = r.1.iter().find(|o| o.system == *sys)?;
            let x0 = i as f64 + 0.1 + si as f64 * w;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + w * 0.95, o.aggregate)],
                color.filled(),
            ))
        }))?
        .label(*sys)
        .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::e2e::scenarios::JobPlan;
    use crate::bench::e2e::systems::Outcome;

    fn scenario(sleeps: &[f64]) -> Scenario {
        named("s", sleeps)
    }

    fn named(name: &str, sleeps: &[f64]) -> Scenario {
        Scenario {
            name: name.into(),
            jobs: sleeps
                .iter()
                .map(|&sleep_ms| JobPlan {
                    subset: 0..10,
                    sleep_ms,
                    start_frac: 0.0,
                })
                .collect(),
            batch: 8,
        }
    }

    fn outcome(system: &'static str, aggregate: f64) -> Outcome {
        Outcome {
            system,
            per_job: vec![aggregate],
            aggregate,
            from_first: aggregate,
            cpu_ms_per_sample: 1.0,
            decodes_per_sample: 1.0,
            hit_ratio: None,
            startup_s: 0.0,
            wait_frac: None,
            stages: Vec::new(),
            samples: 1,
        }
    }

    #[test]
    fn a_ratio_above_k_warns_unless_every_job_has_a_step() {
        let outs = || vec![outcome("joader", 250.0), outcome("independent", 100.0)];
        // Two decode-bound jobs at 2.5x: beyond what sharing allows.
        let w = warnings(&[(scenario(&[0.0, 0.0]), outs())]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("joader is 2.50x independent"), "{w:?}");
        // Within K: no warning.
        let w = warnings(&[(scenario(&[0.0, 0.0, 0.0]), outs())]);
        assert!(w.is_empty(), "{w:?}");
        // One job with a step among decode-bound ones still bounds the ratio by K.
        assert_eq!(warnings(&[(scenario(&[0.0, 2.0]), outs())]).len(), 1);
        // Every job stepping: the step sets the pace, the ratio is not about sharing.
        assert!(warnings(&[(scenario(&[1.5, 1.5]), outs())]).is_empty());
    }

    /// With a K = 1 run, the bound is K times the K = 1 ratio, against every baseline.
    #[test]
    fn the_bound_is_k_times_the_k1_lead_against_every_baseline() {
        let k1 = (
            named(K1, &[0.0]),
            vec![
                outcome("joader", 150.0),
                outcome(TORCH, 100.0),
                outcome(TORCH_CORES_PER_JOB, 100.0),
            ],
        );
        // K = 2: joader shares (x2), the tuned PyTorch keeps its pace, the other halves.
        let k2 = (
            named("sync K=2", &[0.0, 0.0]),
            vec![
                outcome("joader", 300.0),
                outcome(TORCH, 100.0),
                outcome(TORCH_CORES_PER_JOB, 50.0),
            ],
        );
        let rows = [k1, k2];
        let w = warnings(&rows);
        // 3x the tuned PyTorch = 2 x its K=1 lead of 1.5x: allowed. 6x the oversubscribed one
        // is its own loss (0.5x its K=1): flagged, with both factors.
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains(&format!("joader is 6.00x {TORCH_CORES_PER_JOB}")),
            "{w:?}"
        );
        assert!(w[0].contains("joader here / at K=1 = 2.00x"), "{w:?}");
        assert!(
            w[0].contains(&format!("{TORCH_CORES_PER_JOB} here / at K=1 = 0.50x")),
            "{w:?}"
        );
        // The ratio that isolates sharing: (300/150) / (100/100) and (300/150) / (50/100).
        let (sc, outs) = &rows[1];
        assert_eq!(sharing(&rows, sc, &outs[0], TORCH), Some(2.0));
        assert_eq!(sharing(&rows, sc, &outs[0], TORCH_CORES_PER_JOB), Some(4.0));
        // Without the K=1 row there is no such ratio.
        assert_eq!(sharing(&rows[1..], sc, &outs[0], TORCH), None);
        let md = markdown(&rows, 2, 100, 400, 10);
        assert!(
            md.contains("cache 100 B = 25% of the decoded dataset"),
            "{md}"
        );
    }
}
