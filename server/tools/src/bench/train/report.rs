//! The report of `joader bench train`: its header, the markdown tables and a PNG chart; and
//! the server's CPU by stage read from its `/metrics`.

use std::path::Path;

use anyhow::Result;

use super::jobs::Stages;
use super::{Row, Setup, System};

/// The server's `joader_stage_cpu_seconds_total{stage="…"}` series summed by stage; `None`
/// when it exports none.
pub(crate) fn stage_cpu(metrics: &str) -> Option<Stages> {
    let mut out = Stages::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("joader_stage_cpu_seconds_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let stage = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("stage=\"")?.strip_suffix('"'));
        let value = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok());
        if let (Some(stage), Some(value)) = (stage, value) {
            *out.entry(stage.to_owned()).or_default() += value;
        }
    }
    (!out.is_empty()).then_some(out)
}

fn iec(bytes: u64) -> String {
    bytesize::ByteSize(bytes).display().iec().to_string()
}

pub(super) fn header(s: &Setup) -> String {
    let models = if s.models.len() == 1 {
        format!("model {}", s.models[0])
    } else {
        format!(
            "models {} (job i trains model i mod {})",
            s.models.join(", "),
            s.models.len()
        )
    };
    let source = if s.generated {
        "JPEGs of 500x375, quality 90, made from real photos"
    } else {
        "the ImageFolder given"
    };
    let precision = if s.cuda {
        "bf16 autocast, channels_last"
    } else {
        "float32"
    };
    let depth = match s.ring_capacity {
        Some(c) => format!("prefetch {} batches, rings of {c} records", s.prefetch),
        None => format!(
            "prefetch {} batches, rings of the server's default",
            s.prefetch
        ),
    };
    format!(
        "joader bench train: K concurrent training jobs, one process each, on {} ({} cores); {models}, {precision}; batch {}; \
         {} images ({source}, {}), {} classes; decoded set {} (every image decoded and resized to 256 on its shorter side); \
         joader's cache {} = {:.0}% of it; joader's jobs: {depth}",
        s.device,
        s.cores,
        s.batch,
        s.images,
        s.root.display(),
        s.classes,
        iec(s.decoded_bytes),
        iec(s.cache_bytes),
        s.cache_bytes as f64 * 100.0 / s.decoded_bytes.max(1) as f64,
    )
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("-".into(), f)
}

pub(super) fn markdown(s: &Setup, rows: &[Row]) -> String {
    let mut out = format!(
        "{}\n\n\
         Every job of a run is measured over one window: from the moment the last job has done its {} warm-up steps to the moment \
         the first job has done {} steps more; a job's images/s are the images of its steps that ended in the window over the window, \
         so the jobs' figures add up to the total. synthetic: a ready pinned uint8 batch copied to the device every step (the limit); \
         joader: joader.torch.JoaderDataset, the server caching the shorter side resized to 256, RandomResizedCrop(224) + flip in the \
         client, pin_memory; joader-device: the same with device= the training device (padded batches, the crop, flip and resize \
         there through roi_align); pytorch: DataLoader over ImageFolder, cores/K workers per job, persistent, pin_memory, prefetch_factor 4, \
         PIL's RandomResizedCrop(224) + flip. Every system normalizes uint8 batches on the device. CPU in cores over the window (/proc): \
         the server process, and per job its training thread (the main thread) + its other threads + its worker processes. \
         Decodes per delivered image: the server's decodes over its deliveries to the jobs for the whole run (pytorch: each job decodes \
         what it reads).\n\n\
         | K | system | models | images/s (all jobs) | per job images/s | share of synthetic | GPU util | cache / decoded set | \
         server CPU cores | job CPU cores (training thread + other threads + workers) | decodes per delivered image |\n\
         |---:|---|---|---:|---|---:|---:|---:|---:|---|---:|\n",
        header(s),
        s.warmup,
        s.steps,
    );
    for r in rows {
        let synthetic = rows
            .iter()
            .find(|o| o.k == r.k && o.system == System::Synthetic)
            .map(|o| o.total);
        let per: Vec<String> = r.per_job.iter().map(|v| format!("{v:.1}")).collect();
        let cpu: Vec<String> = r
            .jobs_cpu
            .iter()
            .map(|c| format!("{:.2} + {:.2} + {:.2}", c.train, c.other, c.workers))
            .collect();
        let mut models = r.models.clone();
        models.dedup();
        let cache = r
            .system
            .is_joader()
            .then(|| s.cache_bytes as f64 / s.decoded_bytes.max(1) as f64);
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.k,
            r.system.name(),
            if models.len() == 1 {
                models[0].clone()
            } else {
                r.models.join(" / ")
            },
            r.total,
            per.join(" / "),
            opt(synthetic.filter(|&v| v > 0.0), |v| format!(
                "{:.0}%",
                r.total * 100.0 / v
            )),
            r.gpu_util.map_or("n/a".into(), |v| format!("{v:.0}%")),
            opt(cache, |v| format!("{:.0}%", v * 100.0)),
            opt(r.server_cores, |v| format!("{v:.2}")),
            cpu.join(" / "),
            opt(r.decodes_per_image, |v| format!("{v:.2}")),
        ));
    }
    let joader: Vec<&Row> = rows.iter().filter(|r| r.system.is_joader()).collect();
    if !joader.is_empty() {
        out.push_str(
            "\njoader's CPU per stage per delivered image (images the jobs took in the window), from the server's \
             joader_stage_cpu_seconds_total and the clients' Loader.stage_cpu():\n\n\
             | K | system | where | stage | CPU ms per delivered image |\n|---:|---|---|---|---:|\n",
        );
        for r in joader {
            for (side, stages) in [("server", &r.server_stages), ("client", &r.client_stages)] {
                match stages {
                    Some(st) => {
                        for (stage, ms) in st {
                            out.push_str(&format!(
                                "| {} | {} | {side} | {stage} | {ms:.3} |\n",
                                r.k,
                                r.system.name()
                            ));
                        }
                        let total: f64 = st.values().sum();
                        out.push_str(&format!(
                            "| {} | {} | {side} | all stages | {total:.3} |\n",
                            r.k,
                            r.system.name()
                        ));
                    }
                    None => out.push_str(&format!(
                        "| {} | {} | {side} | not exported | - |\n",
                        r.k,
                        r.system.name()
                    )),
                }
            }
        }
    }
    out
}

pub(super) fn chart(rows: &[Row], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    crate::bench::chart_font()?;
    let mut ks: Vec<usize> = rows.iter().map(|r| r.k).collect();
    ks.dedup();
    let mut systems: Vec<System> = Vec::new();
    for r in rows {
        if !systems.contains(&r.system) {
            systems.push(r.system);
        }
    }
    let max = rows.iter().map(|r| r.total).fold(1.0, f64::max) * 1.15;
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "images/s of K concurrent training jobs, over their common window",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..ks.len() as f64, 0f64..max)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(ks.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                ks.get(i).map(|k| format!("K={k}")).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("images/s (all jobs)")
        .draw()?;
    let palette = [
        RGBColor(127, 127, 127),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
    ];
    let w = 0.8 / systems.len().max(1) as f64;
    for (si, sys) in systems.iter().enumerate() {
        let color = palette[si % palette.len()];
        c.draw_series(ks.iter().enumerate().filter_map(|(i, k)| {
            let r = rows.iter().find(|r| r.k == *k && r.system == *sys)?;
            let x0 = i as f64 + 0.1 + si as f64 * w;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + w * 0.95, r.total)],
                color.filled(),
            ))
        }))?
        .label(sys.name())
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

    #[test]
    fn stage_cpu_sums_each_stage_over_its_other_labels() {
        let text = "# HELP joader_stage_cpu_seconds_total CPU by stage\n\
                    joader_stage_cpu_seconds_total{stage=\"decode\",dataset=\"d\"} 1.5\n\
                    joader_stage_cpu_seconds_total{dataset=\"e\",stage=\"decode\"} 0.5\n\
                    joader_stage_cpu_seconds_total{stage=\"read\"} 2e-1\n\
                    joader_cache_hits_total 4\n";
        let s = stage_cpu(text).unwrap();
        assert_eq!(s["decode"], 2.0);
        assert_eq!(s["read"], 0.2);
        assert_eq!(s.len(), 2);
        assert_eq!(stage_cpu("joader_cache_hits_total 4\n"), None);
    }
}
