//! `joader bench e2e --parquet`: the `parquet` source against an image folder of the same
//! JPEGs, K = 4 jobs reading every image together, side by side in one run. The bench's
//! images are written as Hugging Face's `datasets` library writes an image dataset (pyarrow's
//! defaults: Snappy, dictionary pages; the `{bytes, path}` image struct, `ClassLabel`
//! metadata, 100 rows per row group, two files), and each source is served by a `joader
//! serve` child, the rows interleaved and repeated. It prints throughput and its ratio to the
//! folder, decodes per sample, the server's CPU per sample and the bytes its process read per
//! element loaded (`rchar`); then the sources' reads alone, in this process, over every
//! element in a shuffled order: CPU per read, bytes read and decompressed per element.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use joader_storage::{DatasetIndex, SourceSpec};
use serde_json::json;

use super::Ctx;
use super::scenarios::{JobPlan, Scenario};
use super::systems::{Outcome, run_jobs, summarize_runs};
use crate::bench::scale::procs::{DEADLINE, ServerProc};
use crate::client::Client;

/// The jobs of the comparison.
const K: usize = 4;
/// Times each source runs (interleaved; an even number, half with each source first).
const ROUNDS: usize = 4;

/// Writes the image folder `images` as Parquet files in `out`, the way `datasets` does.
const WRITER: &str = r#"
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq

images, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(images) if not d.startswith("."))
rows = []  # ImageFolder's order: sorted class folders, sorted files
for label, c in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(images, c))):
        rows.append((os.path.join(c, f), label))
image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
schema = pa.schema([("image", image_type), ("label", pa.int64())]).with_metadata(
    {"huggingface": json.dumps({"info": {"features": features}})})
os.makedirs(out, exist_ok=True)
shards = 2
per = (len(rows) + shards - 1) // shards
for s in range(shards):
    items = [{"image": {"bytes": open(os.path.join(images, rel), "rb").read(), "path": rel},
              "label": label} for rel, label in rows[s * per:(s + 1) * per]]
    table = pa.Table.from_pylist(items, schema=schema)
    # datasets' row groups for image data: 100 rows; everything else pyarrow's defaults.
    pq.write_table(table, os.path.join(out, f"train-{s:05d}-of-{shards:05d}.parquet"),
                   row_group_size=100, compression="COMPRESSION")
print(len(rows))
"#;

/// The codec of the bench's Parquet files (`--parquet-compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Codec {
    /// pyarrow's (and `datasets`') default.
    Snappy,
    Zstd,
    Gzip,
}

impl Codec {
    pub(super) fn name(self) -> &'static str {
        match self {
            Codec::Snappy => "snappy",
            Codec::Zstd => "zstd",
            Codec::Gzip => "gzip",
        }
    }
}

/// The Parquet copy of the bench's image folder (written once, next to it).
pub(super) fn write_parquet(root: &Path, n: u32, codec: Codec) -> Result<PathBuf> {
    let suffix = match codec {
        Codec::Snappy => "parquet".to_owned(),
        c => format!("parquet-{}", c.name()),
    };
    write_copy(
        root,
        &suffix,
        &WRITER.replace("COMPRESSION", codec.name()),
        "Parquet files (does python3 import pyarrow? pip install pyarrow)",
        n,
    )
}

/// A copy of the bench's image folder that the Python `script` writes (its arguments: the
/// folder and the copy's folder; it prints how many samples it wrote), once, beside the folder
/// in `<folder>-<suffix>` (marked complete when done): `what` names it in errors and logs.
pub(super) fn write_copy(
    root: &Path,
    suffix: &str,
    script: &str,
    what: &str,
    n: u32,
) -> Result<PathBuf> {
    let out = root.with_file_name(format!(
        "{}-{suffix}",
        root.file_name().unwrap_or_default().to_string_lossy()
    ));
    let done = out.join(".complete");
    if done.exists() {
        return Ok(out.canonicalize()?);
    }
    let _ = std::fs::remove_dir_all(&out);
    let t = Instant::now();
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(root)
        .arg(&out)
        .output()
        .context("run python3")?;
    if !o.status.success() {
        bail!(
            "writing the {what} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let written: u32 = String::from_utf8_lossy(&o.stdout).trim().parse()?;
    if written != n {
        bail!("the {what} hold {written} samples, the folder {n} images");
    }
    std::fs::write(&done, b"")?;
    eprintln!(
        "{n} samples written as {what} to {} ({:.1} s)",
        out.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(out.canonicalize()?)
}

/// One source's run: its outcome and the bytes its server read per element loaded.
pub(super) struct Row {
    pub(super) outcome: Outcome,
    pub(super) read_per_element: f64,
    /// Bytes a Parquet source decompressed per element loaded (0 for the others).
    pub(super) decompressed_per_element: f64,
}

/// The bytes process `pid` has read through system calls (`rchar`).
fn rchar(pid: u32) -> Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no rchar in /proc/<pid>/io")
}

fn server_cpu(client: &Client) -> Result<f64> {
    client.ok("GET", "/v1/stats", None)?["process_cpu_s"]
        .as_f64()
        .context("the server reports no process_cpu_s")
}

/// One run of scenario `sc` on a `joader serve` child serving dataset `d` from `spec`.
/// [`ROUNDS`] rounds of `sc` served from two sources, each on a fresh `joader serve` (`tag`
/// and the round name the runs): `a` first in even rounds and `b` first in odd ones, so that
/// neither always runs second. The rows of `a`, then of `b`, by round.
pub(super) fn rounds(
    ctx: &Ctx,
    sc: &Scenario,
    roots: &[PathBuf],
    tag: &str,
    a: (&'static str, &serde_json::Value),
    b: (&'static str, &serde_json::Value),
) -> Result<(Vec<Row>, Vec<Row>)> {
    let (mut rows_a, mut rows_b) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let a_first = round % 2 == 0;
        let (first, second) = if a_first { (a.0, b.0) } else { (b.0, a.0) };
        eprintln!(
            "scenario {} round {}: {first}, then {second}",
            sc.name,
            round + 1
        );
        let run = |suffix: &str, (system, spec): (&'static str, &serde_json::Value)| {
            run_one(
                ctx,
                sc,
                roots,
                &format!("{tag}{round}{suffix}"),
                system,
                spec.clone(),
            )
        };
        if a_first {
            rows_a.push(run("a", a)?);
            rows_b.push(run("b", b)?);
        } else {
            rows_b.push(run("b", b)?);
            rows_a.push(run("a", a)?);
        }
    }
    Ok((rows_a, rows_b))
}

pub(super) fn run_one(
    ctx: &Ctx,
    sc: &Scenario,
    roots: &[PathBuf],
    tag: &str,
    system: &'static str,
    spec: serde_json::Value,
) -> Result<Row> {
    let args = [
        "--cache-slots".to_owned(),
        "8192".to_owned(),
        "--loader-workers".to_owned(),
        ctx.workers.to_string(),
    ];
    let server = ServerProc::start_with(tag, roots, ctx.cache_bytes, &args, &[])?;
    let client = server.client();
    client.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "d", "source": spec})),
    )?;
    let d = client.wait_ready("d", DEADLINE)?;
    if d.items != Some(ctx.index.len() as u64) {
        bail!(
            "{system}: {:?} items, the folder {}",
            d.items,
            ctx.index.len()
        );
    }
    let (cpu0, read0) = (server_cpu(&client)?, rchar(server.pid())?);
    let runs = run_jobs(&client, sc)?;
    let stats = client.ok("GET", "/v1/stats", None)?;
    let cpu = server_cpu(&client)? - cpu0;
    let read = rchar(server.pid())? - read0;
    let decodes = stats["decodes"].as_f64().unwrap_or(0.0);
    let outcome = summarize_runs(system, &runs, cpu, decodes, stats["hit_ratio"].as_f64());
    let decompressed = super::tier::scrape(
        &server.url,
        "joader_parquet_decompressed_bytes_total{dataset=\"d\"}",
    )?;
    Ok(Row {
        outcome,
        read_per_element: read as f64 / decodes.max(1.0),
        decompressed_per_element: decompressed / decodes.max(1.0),
    })
}

/// The sources' reads alone: every element once in a shuffled order on this thread.
struct Reads {
    cpu_us: f64,
    read_per_element: f64,
    decompressed_per_element: Option<f64>,
}

fn read_all(index: &DatasetIndex) -> Result<Reads> {
    let n = index.len() as u32;
    let before = index.parquet_reads();
    let cpu0 = dataplane::stages::thread_cpu_ns();
    let mut bytes = 0u64;
    // A fixed permutation that jumps across files and row groups.
    let step = (n / 3..n).find(|&s| gcd(s, n) == 1).unwrap_or(1);
    for i in 0..n {
        let id = (u64::from(i) * u64::from(step) % u64::from(n)) as u32;
        bytes += index
            .read(id)
            .with_context(|| format!("read element {id}"))?
            .len() as u64;
    }
    let cpu = (dataplane::stages::thread_cpu_ns() - cpu0) as f64 / 1e3;
    let per = |v: u64| v as f64 / f64::from(n);
    Ok(match (before, index.parquet_reads()) {
        (Some(b), Some(a)) => Reads {
            cpu_us: cpu / f64::from(n),
            read_per_element: per(a.bytes_read - b.bytes_read),
            decompressed_per_element: Some(per(a.bytes_decompressed - b.bytes_decompressed)),
        },
        _ => Reads {
            cpu_us: cpu / f64::from(n),
            read_per_element: per(bytes),
            decompressed_per_element: None,
        },
    })
}

/// [`read_all`], dropping the decoded rows kept before each read (the drop, which frees at
/// most one group's rows, is not counted).
fn read_all_located(index: &DatasetIndex) -> Result<Reads> {
    let n = index.len() as u32;
    let before = index.parquet_reads().context("not a parquet dataset")?;
    let step = (n / 3..n).find(|&s| gcd(s, n) == 1).unwrap_or(1);
    let mut cpu = 0;
    for i in 0..n {
        let id = (u64::from(i) * u64::from(step) % u64::from(n)) as u32;
        index.parquet_drop_decoded();
        let t = dataplane::stages::thread_cpu_ns();
        index
            .read(id)
            .with_context(|| format!("read element {id}"))?;
        cpu += dataplane::stages::thread_cpu_ns() - t;
    }
    let after = index.parquet_reads().context("not a parquet dataset")?;
    let per = |v: u64| v as f64 / f64::from(n);
    Ok(Reads {
        cpu_us: cpu as f64 / 1e3 / f64::from(n),
        read_per_element: per(after.bytes_read - before.bytes_read),
        decompressed_per_element: Some(per(after.bytes_decompressed - before.bytes_decompressed)),
    })
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Runs the comparison and returns its markdown.
pub(super) fn run(ctx: &Ctx, n: u32, codec: Codec) -> Result<String> {
    let parquet_dir = write_parquet(&ctx.root, n, codec)?;
    // The reads alone (this process) spill as a server does by default.
    let spill = tempfile::Builder::new()
        .prefix("joader-bench-spill-")
        .tempdir()?;
    joader_storage::ParquetSpill {
        dir: spill.path().to_owned(),
        bytes: joader_storage::default_spill_bytes(spill.path()),
    }
    .set();
    super::super::warm_page_cache(&parquet_dir)?;
    let roots = [ctx.root.clone(), parquet_dir.clone()];
    let sc = Scenario {
        name: format!("parquet K={K}"),
        jobs: (0..K)
            .map(|_| JobPlan {
                subset: 0..n,
                sleep_ms: 0.0,
                start_frac: 0.0,
            })
            .collect(),
        batch: 16,
    };
    let folder_spec = json!({"kind": "image_folder", "path": ctx.root});
    let parquet_spec = json!({"kind": "parquet", "paths": [parquet_dir]});
    let (folder, parquet) = rounds(
        ctx,
        &sc,
        &roots,
        "pq",
        ("joader serve, image folder", &folder_spec),
        ("joader serve, parquet", &parquet_spec),
    )?;
    let codec_name = codec.name();
    let pq_index = joader_storage::index(
        &serde_json::from_value::<SourceSpec>(parquet_spec)?,
        &roots,
        &mut |_| {},
    )?;
    let reads_folder = read_all(&ctx.index)?;
    let reads_parquet = read_all(&pq_index)?;
    // Again, with no decoded row kept (as in an epoch over a dataset larger than the 64 MiB
    // they may hold): every row read from its location, as about its own bytes.
    let reads_located = read_all_located(&pq_index)?;
    Ok(report(
        &sc,
        codec_name,
        &folder,
        &parquet,
        [
            ("image folder", &reads_folder),
            ("parquet, first pass", &reads_parquet),
            ("parquet, rows located", &reads_located),
        ],
    ))
}

/// The table of rounds of two systems served side by side (`base`'s row first in each round,
/// ratios to it), under `heading`; with the means over the rounds of `other`'s throughput and
/// server CPU per sample over `base`'s.
pub(super) fn paired(
    heading: &str,
    column: &str,
    versus: &str,
    base: &[Row],
    other: &[Row],
) -> (String, f64, f64) {
    let mut out = format!(
        "\n### {heading}\n\n\
         | {column} | round | samples/s | x {versus} (same round) | decodes/sample | server CPU ms/sample | server read bytes/element |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for (i, (b, o)) in base.iter().zip(other).enumerate() {
        for r in [b, o] {
            let x = &r.outcome;
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.0} |\n",
                x.system,
                i + 1,
                x.aggregate,
                x.aggregate / b.outcome.aggregate,
                x.decodes_per_sample,
                x.cpu_ms_per_sample,
                r.read_per_element
            ));
        }
    }
    let pairs = || base.iter().zip(other);
    let ratio = mean(pairs().map(|(b, o)| o.outcome.aggregate / b.outcome.aggregate));
    let cpu = mean(pairs().map(|(b, o)| o.outcome.cpu_ms_per_sample / b.outcome.cpu_ms_per_sample));
    (out, ratio, cpu)
}

pub(super) fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = v.fold((0.0, 0.0), |(s, c), x| (s + x, c + 1.0));
    sum / f64::max(count, 1.0)
}

fn report(
    sc: &Scenario,
    codec: &str,
    folder: &[Row],
    parquet: &[Row],
    reads: [(&str, &Reads); 3],
) -> String {
    let heading = format!(
        "Parquet ({codec}) against the same image folder ({}, {} rounds interleaved)",
        sc.name,
        folder.len()
    );
    let (mut out, ratio, cpu) = paired(&heading, "source", "folder", folder, parquet);
    let read = mean(parquet.iter().map(|r| r.read_per_element));
    let decompressed = mean(parquet.iter().map(|r| r.decompressed_per_element));
    let row = mean(folder.iter().map(|r| r.read_per_element));
    let times = (read + decompressed) / row.max(1.0);
    out.push_str(&format!(
        "\nparquet / image folder, mean of the rounds: throughput {ratio:.3}x, server CPU per \
         sample {cpu:.3}x; the parquet server read {read:.0} and decompressed \
         {decompressed:.0} bytes per element loaded: together {times:.2}x the folder's \
         {row:.0} bytes read per element\n\n\
         Reads alone (this process, one thread, every element once, shuffled):\n\n\
         | source | read CPU µs/element | bytes read/element | bytes decompressed/element |\n\
         |---|---|---|---|\n"
    ));
    for (name, r) in reads {
        out.push_str(&format!(
            "| {name} | {:.1} | {:.0} | {} |\n",
            r.cpu_us,
            r.read_per_element,
            r.decompressed_per_element
                .map_or_else(|| "-".to_owned(), |d| format!("{d:.0}"))
        ));
    }
    out
}
