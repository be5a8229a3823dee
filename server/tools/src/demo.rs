//! `joader demo`: generates an ImageNet-like dataset, starts a server in-process and runs four
//! jobs through the Rust client: two on the whole dataset started together, one on half of the
//! classes, and one started later at half speed. Prints live progress and, at the end, what
//! each job received and how many decodes sharing saved.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use crate::client::{Client, ReadOptions, consume};
use crate::inprocess::ServerHandle;
use crate::synth::{SynthSpec, generate_image_folder};
use server::Config;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where the generated dataset lives (reused by later runs).
    #[arg(long, env = "JOADER_DEMO_DATA", default_value = "joader-demo-data")]
    pub data: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    #[arg(long, default_value_t = 300)]
    pub per_class: u32,
    /// Epochs of each job.
    #[arg(long, default_value_t = 2)]
    pub epochs: u32,
    #[arg(long, default_value_t = 32)]
    pub batch_size: u32,
    /// Shared-memory cache size (bytes or 512MiB, 2GiB, …).
    #[arg(long, default_value = "768MiB", value_parser = server::config::parse_bytes)]
    pub cache_bytes: u64,
    /// Decode threads (default: number of cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// No progress bars (for logs and tests).
    #[arg(long)]
    pub quiet: bool,
}

struct JobPlan {
    name: &'static str,
    what: &'static str,
    subset: Option<Value>,
    /// Start after the first job has consumed this fraction of its first epoch.
    start_after: f64,
    half_speed: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let spec = SynthSpec {
        classes: args.classes,
        per_class: args.per_class,
        width: 500,
        height: 375,
        quality: 90,
        seed: 2022,
    };
    let images = u64::from(spec.classes) * u64::from(spec.per_class);
    if images == 0 {
        bail!("the demo needs at least one class and one image per class");
    }
    let mp = if args.quiet {
        MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden())
    } else {
        MultiProgress::new()
    };
    let gen_bar = mp.add(ProgressBar::new(images));
    gen_bar.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len}")
            .context("style")?
            .progress_chars("=> "),
    );
    gen_bar.set_message("generating JPEGs");
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create {}", args.data.display()))?;
    let data = args.data.canonicalize()?;
    let t = Instant::now();
    generate_image_folder(&data, &spec, &mut |n| gen_bar.set_position(n))
        .context("generating the demo dataset")?;
    gen_bar.finish_with_message(format!(
        "dataset ready ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));

    // The server, in-process, on a free port with its own shared-memory instance.
    let state_dir = tempfile::Builder::new().prefix("joader-demo-").tempdir()?;
    let config = Config {
        bind: "127.0.0.1:0".parse()?,
        data_dir: state_dir.path().to_path_buf(),
        instance: format!("demo_{}", std::process::id()),
        cache_bytes: args.cache_bytes,
        cache_slots: 8192,
        allowed_roots: vec![data.clone()],
        loader_workers: args
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        ..Config::default()
    };
    let instance = config.instance.clone();
    let server = ServerHandle::spawn(config)?;
    let client = Arc::new(Client::new(server.url.clone()));
    client.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "demo", "source": {"kind": "image_folder", "path": data}})),
    )?;
    let ds = client.wait_ready("demo", Duration::from_secs(120))?;
    let classes: Vec<String> = ds.classes.unwrap_or_default();
    let half: Vec<String> = classes
        .iter()
        .take(classes.len().div_ceil(2))
        .cloned()
        .collect();

    let plans = [
        JobPlan {
            name: "resnet18-lr0.1",
            what: "whole dataset",
            subset: None,
            start_after: 0.0,
            half_speed: false,
        },
        JobPlan {
            name: "resnet18-lr0.01",
            what: "whole dataset",
            subset: None,
            start_after: 0.0,
            half_speed: false,
        },
        JobPlan {
            name: "half-classes",
            what: "half of the classes",
            subset: Some(json!({"classes": half})),
            start_after: 0.0,
            half_speed: false,
        },
        JobPlan {
            name: "late-slow",
            what: "whole, late, half speed",
            subset: None,
            start_after: 0.25,
            half_speed: true,
        },
    ];
    let lead_progress = Arc::new(AtomicU64::new(0));
    // (job index, (samples, epochs, elapsed))
    type Outcome = (usize, Result<(u64, u32, Duration)>);
    let results: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::new()));
    let style = ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {per_sec}")
        .context("style")?
        .progress_chars("=> ");
    std::thread::scope(|scope| {
        for (i, plan) in plans.iter().enumerate() {
            let client = client.clone();
            let lead = lead_progress.clone();
            let results = results.clone();
            let instance = instance.clone();
            let bar = mp.add(ProgressBar::new(0));
            bar.set_style(style.clone());
            bar.set_message(plan.name.to_string());
            let batch = args.batch_size;
            let epochs = args.epochs;
            scope.spawn(move || {
                let r = (|| -> Result<(u64, u32, Duration)> {
                    while (lead.load(Relaxed) as f64) < plan.start_after * images as f64 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let mut req = json!({"name": plan.name, "dataset": "demo", "batch_size": batch, "epochs": epochs, "seed": i});
                    if let Some(s) = &plan.subset {
                        req["subset"] = s.clone();
                    }
                    let reg = client.register(&req)?;
                    bar.set_length(reg.job.subset_size * u64::from(epochs));
                    let ring = reg.ranks.first().context("no ring in the registration")?.ring.clone();
                    let got = consume(
                        &instance,
                        &ring,
                        ReadOptions { batch: batch as usize, max_samples: None, hold: Duration::ZERO },
                        // Half speed: spend as long again as the batch took to arrive, or
                        // what the training step would take.
                        |n, fetch| if plan.half_speed { fetch.max(Duration::from_micros(1500) * n as u32) } else { Duration::ZERO },
                        |n| {
                            bar.set_position(n);
                            if i == 0 {
                                lead.store(n, Relaxed);
                            }
                        },
                        |_, _| {},
                    )?;
                    bar.finish();
                    Ok((got.samples, got.epochs.len() as u32, got.elapsed))
                })();
                if r.is_err() {
                    bar.abandon_with_message(format!("{} failed", plan.name));
                }
                results.lock().expect("results lock").push((i, r));
            });
        }
    });

    let stats = client.stats()?;
    let jobs = client.jobs()?;
    let mut results = std::mem::take(&mut *results.lock().expect("results lock"));
    results.sort_by_key(|r| r.0);
    println!();
    println!(
        "{:<18} {:<26} {:>9} {:>7} {:>10} {:>10}",
        "job", "data", "samples", "epochs", "samples/s", "hit ratio"
    );
    let mut independent_decodes = 0u64;
    let mut failed = Vec::new();
    for (i, r) in &results {
        let plan = &plans[*i];
        let hit_ratio = jobs
            .iter()
            .find(|j| j.name == plan.name)
            .map_or(0.0, |j| j.hit_ratio);
        match r {
            Ok((samples, epochs, elapsed)) => {
                independent_decodes += samples;
                println!(
                    "{:<18} {:<26} {:>9} {:>7} {:>10.0} {:>9.1}%",
                    plan.name,
                    plan.what,
                    samples,
                    epochs,
                    *samples as f64 / elapsed.as_secs_f64().max(1e-9),
                    hit_ratio * 100.0
                );
            }
            Err(e) => {
                println!("{:<18} {:<26} failed: {e:#}", plan.name, plan.what);
                failed.push(plan.name);
            }
        }
    }
    let decodes = stats.decodes;
    println!();
    println!(
        "decodes performed: {decodes}; independent loaders would have decoded {independent_decodes} ({:.1}x as many); \
         cache hit ratio {:.1}%; mean jobs per sampled element {:.2}",
        independent_decodes as f64 / decodes.max(1) as f64,
        stats.hit_ratio * 100.0,
        stats.mean_share,
    );
    println!(
        "demo finished in {:.1} s (dataset in {})",
        started.elapsed().as_secs_f64(),
        data.display()
    );
    server.stop()?;
    if !failed.is_empty() {
        bail!("job(s) {} failed", failed.join(", "));
    }
    Ok(())
}
