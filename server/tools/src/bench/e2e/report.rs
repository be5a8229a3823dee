//! The report of `joader bench e2e`: a markdown table and a PNG chart.

use std::path::Path;

use anyhow::{Context, Result};

use super::scenarios::Scenario;
use super::systems::{CachedStep, Outcome};

pub(super) fn markdown(
    rows: &[(Scenario, Vec<Outcome>)],
    workers: usize,
    cache_bytes: u64,
    n: u32,
) -> String {
    let cache = bytesize::ByteSize(cache_bytes).display().iec();
    let mut s = format!(
        "joader bench e2e: {n} images 500x375 -> decode, resize 256 (cached), per job RandomResizedCrop 224 + flip; \
         {workers} decode threads; cache {cache}\n\n| scenario | system | samples/s (all jobs) | per job samples/s | CPU ms/sample | decodes/sample | hit ratio | throughput vs independent | CPU vs independent | throughput vs pytorch | CPU vs pytorch | start-up s | wait in next() |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (sc, outs) in rows {
        for o in outs {
            let per: Vec<String> = o.per_job.iter().map(|r| format!("{r:.0}")).collect();
            let [(tr, cr), (tp, cp)] = ["independent", "pytorch"].map(|b| ratios(o, outs, b));
            s.push_str(&format!(
                "| {} | {} | {:.0} | {} | {:.2} | {:.2} | {} | {tr} | {cr} | {tp} | {cp} | {} | {} |\n",
                sc.name,
                o.system,
                o.aggregate,
                per.join(" / "),
                o.cpu_ms_per_sample,
                o.decodes_per_sample,
                o.hit_ratio
                    .map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
                o.startup_s.map_or("-".into(), |v| format!("{v:.2}")),
                o.wait_frac
                    .map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
            ));
        }
    }
    s
}

/// Throughput and CPU ratios of `o` against the system `base` of the same scenario.
fn ratios(o: &Outcome, outs: &[Outcome], base: &str) -> (String, String) {
    outs.iter().find(|b| b.system == base).map_or_else(
        || ("-".into(), "-".into()),
        |b| {
            (
                format!("{:.2}x", o.aggregate / b.aggregate.max(1e-9)),
                format!(
                    "{:.2}x",
                    o.cpu_ms_per_sample / b.cpu_ms_per_sample.max(1e-9)
                ),
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

/// Independent loading's aggregate over the synchronous scenarios (K = 1, 2, …): on a
/// decode-bound machine it must stay flat, since every K has the same threads at full use.
pub(super) fn independent_by_k(rows: &[(Scenario, Vec<Outcome>)]) -> Option<String> {
    let by_k: Vec<(usize, f64)> = rows
        .iter()
        .filter(|(sc, _)| sc.name.starts_with("sync K="))
        .filter_map(|(sc, outs)| {
            let o = outs.iter().find(|o| o.system == "independent")?;
            Some((sc.jobs.len(), o.aggregate))
        })
        .collect();
    let first = by_k.first()?.1.max(1e-9);
    let cells: Vec<String> = by_k
        .iter()
        .map(|(k, a)| format!("K={k} {a:.0}/s ({:.2}x)", a / first))
        .collect();
    Some(format!(
        "\nIndependent loading, aggregate by K (vs K=1): {}\n",
        cells.join(", ")
    ))
}

/// Against independent loading (the same decode code on the same threads), a throughput
/// ratio above the number of jobs is beyond what sharing can do: the baseline of that
/// scenario was disturbed (another process on the cores, a stall), not beaten. Where every
/// job has a training step (`step 100 ms/64`), the step sets the pace and the ratio measures how
/// well a system overlaps loading with it, not sharing: no warning there.
pub(super) fn warnings(rows: &[(Scenario, Vec<Outcome>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (sc, outs) in rows {
        if sc.jobs.iter().all(|j| j.sleep_ms > 0.0) {
            continue;
        }
        let k = sc.jobs.len() as f64;
        for o in outs {
            for b in outs.iter().filter(|b| b.system == "independent") {
                let r = o.aggregate / b.aggregate.max(1e-9);
                if o.system != b.system && r > k * 1.05 {
                    out.push(format!(
                        "{}: {} is {r:.2}x {} with {k} job(s), above the {k}x that sharing allows; that baseline was disturbed in this run",
                        sc.name, o.system, b.system
                    ));
                }
            }
        }
    }
    out
}

pub(super) fn chart(rows: &[(Scenario, Vec<Outcome>)], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let font = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok())
    .context("no TrueType font found (install fonts-dejavu-core)")?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("the font could not be loaded"))?;
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
        .caption("aggregate delivered samples/s", ("sans-serif", 24))
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
        Scenario {
            name: "s".into(),
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
            cpu_ms_per_sample: 1.0,
            decodes_per_sample: 1.0,
            hit_ratio: None,
            startup_s: None,
            wait_frac: None,
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
}
