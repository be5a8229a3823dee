//! `joader consume`: registers a job with a running server and reads it to the end (a
//! debugging client; the integration tests run it as a separate process), then prints a JSON
//! summary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use server::http::views::JobStateName;

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Server URL.
    #[arg(long, env = "JOADER_SERVER", default_value = "http://127.0.0.1:7480")]
    pub server: String,
    /// The job registration, as the JSON body of POST /v1/jobs.
    #[arg(long)]
    pub job: String,
    /// Which rank's ring to read.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Sleep this many microseconds per sample (a slower training step).
    #[arg(long, default_value_t = 0)]
    pub sample_us: u64,
    /// Stop after this many samples without acknowledging more (tests kill it then).
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// Write each element's payload as `<dir>/<epoch>-<position>-<element>.bin`.
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Fail when the ring gives no record for this many seconds (a job that stalled or
    /// deadlocked), naming the job and the state the server reports for it; 0: wait as long
    /// as the server lives.
    #[arg(long, default_value_t = 600)]
    pub deadline_s: u64,
    #[arg(long, env = "JOADER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn run(args: ConsumeArgs) -> Result<()> {
    let client = crate::client::Client::new(args.server.clone()).with_token(args.token.clone());
    let body: serde_json::Value = serde_json::from_str(&args.job).context("--job is not JSON")?;
    let reg = client.register(&body)?;
    let rank = reg
        .ranks
        .iter()
        .find(|x| x.rank == args.rank)
        .with_context(|| format!("the server returned no rank {}", args.rank))?;
    let (instance, ring) = (rank.instance.clone(), rank.ring.clone());
    let batch = reg.job.batch_size as usize;
    // The server names a job registered without a name.
    let name = reg.job.name.clone();
    // Tell a waiting test that the job is registered.
    eprintln!("registered ring={ring}");
    let per = Duration::from_micros(args.sample_us);
    let mut dump_err = None;
    let got = match crate::client::consume_within(
        &instance,
        &ring,
        // Hold the unacknowledged batch until killed.
        crate::client::ReadOptions {
            batch,
            max_samples: args.stop_after,
            hold: Duration::from_secs(3600),
        },
        (args.deadline_s > 0).then(|| Duration::from_secs(args.deadline_s)),
        |n, _| per * n as u32,
        |_| {},
        |meta, data| {
            if let Some(dir) = &args.dump {
                let p = dir.join(format!(
                    "{}-{}-{}.bin",
                    meta.epoch, meta.position, meta.element_id
                ));
                if let Err(e) = std::fs::write(&p, data) {
                    dump_err.get_or_insert(e);
                }
            }
        },
    ) {
        Ok(got) => got,
        Err(e) => {
            if let Some(stalled) = e.downcast_ref::<crate::client::Stalled>() {
                bail!(
                    "job {name} rank {}: {stalled} (--deadline-s {}: raise it for a job that is \
                     only slow); the server says: {}",
                    args.rank,
                    args.deadline_s,
                    job_state(&client, &name)
                );
            }
            // A closed ring: say why when the server failed the job (a multi-node job whose
            // node or leader was lost is `job_failed`).
            let closed = e
                .downcast_ref::<dataplane::Error>()
                .is_some_and(|d| d.code() == "ring_closed");
            if closed
                && let Ok(job) = client.job(&name)
                && job.state == JobStateName::Failed
            {
                let reason = job.reason.as_deref().unwrap_or("");
                let reason = reason.strip_prefix("job_failed: ").unwrap_or(reason);
                bail!("job_failed: job {name} failed: {reason}");
            }
            return Err(e);
        }
    };
    if let Some(e) = dump_err {
        return Err(e).context("cannot write a payload");
    }
    let summary = serde_json::json!({
        "samples": got.samples,
        "elapsed_s": got.elapsed.as_secs_f64(),
        "first_wait_s": got.first_wait.as_secs_f64(),
        "longest_wait_s": got.longest_wait.as_secs_f64(),
        "epochs": got.epochs.iter().map(|e| e.iter().map(|(id, label)| [i64::from(*id), *label]).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "errors": got.errors,
    });
    println!("{summary}");
    Ok(())
}

/// The job's state as the server reports it, in a line: its state (and why it failed), where
/// it is, and the counters that tell a stall (what was sampled, pushed and acknowledged, the
/// client's time on an empty ring, the units that waited for room other jobs held).
pub fn job_state(client: &crate::client::Client, name: &str) -> String {
    match client.job(name) {
        Ok(j) => format!(
            "state {}{}, epoch {} position {}, sampled {} delivered {} acknowledged {}, \
             stall_s {}, waited_for_others {}",
            serde_json::to_value(j.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            j.reason.map(|r| format!(" ({r})")).unwrap_or_default(),
            j.epoch,
            j.position,
            j.sampled,
            j.delivered,
            j.acknowledged,
            j.stall_s,
            j.waited_for_others,
        ),
        Err(e) => format!("nothing: the job's state could not be read ({e:#})"),
    }
}
