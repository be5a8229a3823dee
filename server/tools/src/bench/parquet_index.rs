//! `joader bench parquet-index`: indexing an ImageNet-size `parquet` dataset on a real `joader
//! serve` process, against the catalog's targets at that scale (the same as `bench scale`'s
//! manifest: ready within 10 s, `RssAnon` growth within 120 MB for 1,281,167 items).
//!
//! The dataset is generated once by pyarrow, shaped like Hugging Face's ImageNet-1k train
//! split: `--items` rows (1,281,167) in files of `--rows-per-file` (4,300, about 300 files)
//! with 100 rows per row group (the `datasets` library's row groups for images), the
//! `{bytes, path}` image struct, an int64 `label` with `ClassLabel` metadata naming 1,000
//! classes, Snappy. Each row's image is `--image-bytes` (110) distinct random bytes, about
//! 150 MB in all: indexing reads footers and the label column, never an image, so what the
//! bytes are changes nothing but the files' size.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;

use super::scale::procs::{DEADLINE, ServerProc};

#[derive(Debug, Args)]
pub struct ParquetIndexArgs {
    /// Rows of the generated dataset (ImageNet-1k train has 1,281,167).
    #[arg(long, default_value_t = 1_281_167)]
    pub items: u64,
    /// Rows per file.
    #[arg(long, default_value_t = 4300)]
    pub rows_per_file: u64,
    /// Bytes of each row's image.
    #[arg(long, default_value_t = 110)]
    pub image_bytes: u64,
    /// Where the dataset is generated (reused when its shape matches).
    #[arg(long, default_value = "joader-bench-data/parquet-index")]
    pub data: PathBuf,
}

const WRITER: &str = r#"
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq

out, items, per_file, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = [f"n{c:08d}" for c in range(1000)]
image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
schema = pa.schema([("image", image_type), ("label", pa.int64())]).with_metadata(
    {"huggingface": json.dumps({"info": {"features": features}})})
files = (items + per_file - 1) // per_file
os.makedirs(out, exist_ok=True)
for f in range(files):
    lo, hi = f * per_file, min(items, (f + 1) * per_file)
    blob = os.urandom(size * (hi - lo))
    data = pa.array([blob[i * size:(i + 1) * size] for i in range(hi - lo)], pa.binary())
    paths = pa.array([f"{i}.JPEG" for i in range(lo, hi)], pa.string())
    image = pa.StructArray.from_arrays([data, paths], fields=list(image_type))
    label = pa.array([i % 1000 for i in range(lo, hi)], pa.int64())
    table = pa.Table.from_arrays([image, label], schema=schema)
    pq.write_table(table, os.path.join(out, f"train-{f:05d}-of-{files:05d}.parquet"),
                   row_group_size=100)
print(files)
"#;

pub fn run(args: ParquetIndexArgs) -> Result<()> {
    let shape = format!("{}x{}x{}", args.items, args.rows_per_file, args.image_bytes);
    let dir = args.data.join(&shape);
    let done = dir.join(".complete");
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "generating {} rows of Parquet in {}…",
            args.items,
            dir.display()
        );
        let t = Instant::now();
        let o = Command::new("python3")
            .args(["-c", WRITER])
            .arg(&dir)
            .args([
                args.items.to_string(),
                args.rows_per_file.to_string(),
                args.image_bytes.to_string(),
            ])
            .output()
            .context("run python3")?;
        if !o.status.success() {
            bail!(
                "generating the dataset failed (does python3 import pyarrow? pip install pyarrow): {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::fs::write(&done, b"")?;
        eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());
    }
    let dir = dir.canonicalize()?;
    let (mut files, mut bytes) = (0u64, 0u64);
    for e in std::fs::read_dir(&dir)? {
        let e = e?;
        if e.path().extension().is_some_and(|x| x == "parquet") {
            files += 1;
            bytes += e.metadata()?.len();
        }
    }
    // Like `bench scale`, from the page cache: the figure is joader's work, not the disk's.
    super::warm_page_cache(&dir)?;
    let server = ServerProc::start("pqindex", std::slice::from_ref(&dir), 64 << 20)?;
    let c = server.client();
    c.ok("GET", "/healthz", None)?;
    let rss0 = server.settled_rss()?;
    let start = Instant::now();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "large", "source": {"kind": "parquet", "paths": [dir]}})),
    )?;
    let ds = c.wait_ready("large", DEADLINE)?;
    let ready_s = start.elapsed().as_secs_f64();
    let rss1 = server.settled_rss()?;
    let items = ds.items.context("no items")?;
    if items != args.items {
        bail!("indexed {items} items, generated {}", args.items);
    }
    let index_bytes = ds.index_bytes.context("no index_bytes")?;
    let classes = ds.classes.as_ref().map_or(0, Vec::len);
    let per_item = |b: u64| b as f64 / items as f64;
    let rss = rss1.saturating_sub(rss0);
    println!(
        "joader bench parquet-index: {items} rows in {files} files ({:.0} MB), 100 rows per row \
         group, {classes} ClassLabel classes\n",
        bytes as f64 / 1e6
    );
    println!("| what | measured | target |\n|---|---|---|");
    println!("| time until ready (index + persist) | {ready_s:.2} s | <= 10 s |");
    println!(
        "| RssAnon growth | {:.1} B/item ({:.1} MB); the index's columns {:.1} B/item | <= 120 MB for 1,281,167 (93.7 B/item) |",
        per_item(rss),
        rss as f64 / 1e6,
        per_item(index_bytes)
    );
    Ok(())
}
