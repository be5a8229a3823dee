//! `joader preload`: preloads a dataset's working set into a running server's cache and pins
//! it (`POST /v1/datasets/{name}/preload`), waiting with a progress bar until it is ready;
//! `--release` releases it (`DELETE`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};
use server::http::views::{DatasetView, PreloadView};

use crate::client::Client;

#[derive(Debug, clap::Args)]
pub struct PreloadArgs {
    /// The dataset's name.
    pub dataset: String,
    /// Server URL.
    #[arg(long, env = "JOADER_SERVER", default_value = "http://127.0.0.1:7480")]
    pub server: String,
    /// The elements to preload, as a job's `subset` (JSON: `{"start": 0, "end": 1000}`,
    /// `{"classes": ["cat"]}`, a list of ids, ...); the whole dataset when not given.
    #[arg(long)]
    pub subset: Option<String>,
    /// The pipeline the jobs will use (JSON, as a job's `pipeline`); the server's default when
    /// not given. Jobs share the preloaded elements only with the same pipeline.
    #[arg(long)]
    pub pipeline: Option<String>,
    /// Keep the working set's stored bytes in the server's disk tier instead of decoded in
    /// memory (an object-store dataset on a server with `--disk-cache`; no `--pipeline`).
    #[arg(long, conflicts_with = "pipeline")]
    pub disk: bool,
    /// Return once the server accepted the preload, without waiting for it to be ready.
    #[arg(long)]
    pub no_wait: bool,
    /// Release the dataset's preload instead (its elements become evictable).
    #[arg(long, conflicts_with_all = ["subset", "pipeline", "no_wait", "disk"])]
    pub release: bool,
    /// Give up waiting after this many seconds (the preload goes on in the server).
    #[arg(long, default_value_t = 3600)]
    pub deadline_s: u64,
    #[arg(long, env = "JOADER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn run(args: PreloadArgs) -> Result<()> {
    let client = Client::new(args.server.clone()).with_token(args.token.clone());
    let path = format!("/v1/datasets/{}/preload", args.dataset);
    if args.release {
        client.ok("DELETE", &path, None)?;
        println!("released the preload of dataset '{}'", args.dataset);
        return Ok(());
    }
    let mut body = json!({});
    if let Some(s) = &args.subset {
        body["subset"] = serde_json::from_str::<Value>(s).context("--subset is not JSON")?;
    }
    if let Some(p) = &args.pipeline {
        body["pipeline"] = serde_json::from_str::<Value>(p).context("--pipeline is not JSON")?;
    }
    if args.disk {
        body["keep"] = json!("disk");
    }
    let d: DatasetView = client.typed("POST", &path, Some(&body))?;
    let p = d
        .preload
        .context("the server answered without the preload")?;
    if args.no_wait {
        println!("{}", serde_json::to_string(&p)?);
        return Ok(());
    }
    let last = wait(&client, &args, p)?;
    println!("{}", serde_json::to_string(&last)?);
    Ok(())
}

/// Polls the dataset until its preload is ready (or failed, or the deadline passed), drawing
/// a bar of the elements pinned on a terminal.
fn wait(client: &Client, args: &PreloadArgs, first: PreloadView) -> Result<PreloadView> {
    let bar = ProgressBar::new(first.elements);
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "preload {prefix} [{bar:30}] {pos}/{len} elements, {msg} ({elapsed}, eta {eta})",
        )?
        .progress_chars("=> "),
    );
    bar.set_prefix(args.dataset.clone());
    let deadline = Instant::now() + Duration::from_secs(args.deadline_s);
    let mut p = first;
    loop {
        bar.set_position(p.pinned + p.failed);
        bar.set_message(format!(
            "{} MiB pinned{}{}",
            p.pinned_bytes >> 20,
            if args.disk { " on disk" } else { "" },
            if p.waiting_for_room {
                ", waiting for room jobs hold"
            } else {
                ""
            }
        ));
        match p.state.as_str() {
            "ready" => {
                bar.finish();
                return Ok(p);
            }
            "failed" => {
                bar.abandon();
                bail!(
                    "the preload of '{}' failed: {}",
                    args.dataset,
                    p.reason.unwrap_or_default()
                );
            }
            _ => {}
        }
        if Instant::now() > deadline {
            bar.abandon();
            bail!(
                "the preload of '{}' is not ready after {} s ({} of {} elements pinned); it goes \
                 on in the server",
                args.dataset,
                args.deadline_s,
                p.pinned,
                p.elements
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        let d: DatasetView =
            client.typed("GET", &format!("/v1/datasets/{}", args.dataset), None)?;
        p = d
            .preload
            .with_context(|| format!("the preload of '{}' was released", args.dataset))?;
    }
}
