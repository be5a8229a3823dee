//! `joader bench e2e --fields`: samples with a caption and a JSON document beside the image
//! (issue 29) against the same images without them, K = 4 jobs reading every image together,
//! side by side in one run. The bench's images are written once as WebDataset shards (as
//! `webdataset.TarWriter` names members: `000001.jpg`, `.cls`, `.txt`, `.json`), and the same
//! shards are served twice by `joader serve` children: declared with `fields` (image, class,
//! caption, meta: each item is its key's whole range, the fields checked and stored after the
//! image in its slot) and without (image and class, as before), the runs interleaved and
//! repeated. It prints throughput and its ratio to the run without fields, decodes per
//! sample, the server's CPU per sample and the bytes its process read per element loaded.
//! The consumers are the bench's Rust jobs, which read the images (the fields travel in the
//! slots; what a client does with them is its own cost).
//!
//! Then the same comparison over Parquet files written as Hugging Face's `datasets` writes
//! them (100 rows per row group), with a caption column (a string: a binary column) and the
//! same JSON document as a struct column (assembled from its leaves, the cost `parquet/small.rs`
//! keeps per row group).

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

use super::Ctx;
use super::parquet::{Row, paired, rounds};
use super::scenarios::{JobPlan, Scenario};

/// The jobs of the comparison.
const K: usize = 4;

/// Writes the image folder `images` as WebDataset shards in `out` with a caption (about 80
/// bytes) and a JSON document (about 200 bytes) per sample.
const WRITER: &str = r#"
import io, json, os, sys, tarfile

images, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(images) if not d.startswith("."))
rows = []  # ImageFolder's order: sorted class folders, sorted files
for label, c in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(images, c))):
        rows.append((os.path.join(c, f), label))
os.makedirs(out, exist_ok=True)
shards = 4
per = (len(rows) + shards - 1) // shards

def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    tar.addfile(info, io.BytesIO(data))

for s in range(shards):
    with tarfile.open(os.path.join(out, f"shard-{s:06d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(s * per, min((s + 1) * per, len(rows))):
            rel, label = rows[i]
            key = f"{i:06d}"
            add(tar, key + ".jpg", open(os.path.join(images, rel), "rb").read())
            add(tar, key + ".cls", str(label).encode())
            add(tar, key + ".txt", f"a photo of a {classes[label]}, sample {i}, taken outdoors in daylight".encode())
            meta = {"id": i, "source": rel, "width": 500, "height": 375,
                    "boxes": [[10.5, 20.0, 100.0, 80.0 + i % 7]], "tags": ["synthetic", classes[label]]}
            add(tar, key + ".json", json.dumps(meta).encode())
print(len(rows))
"#;

/// Writes the image folder `images` as Parquet files in `out` (the `--parquet` bench's shape)
/// with a caption column and a struct column holding the shards' JSON document.
const PQ_WRITER: &str = r#"
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq

images, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(images) if not d.startswith("."))
rows = []
for label, c in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(images, c))):
        rows.append((os.path.join(c, f), label))
image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
meta_type = pa.struct([("id", pa.int64()), ("source", pa.string()), ("width", pa.int64()),
                       ("height", pa.int64()), ("boxes", pa.list_(pa.list_(pa.float64()))),
                       ("tags", pa.list_(pa.string()))])
features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
schema = pa.schema([("image", image_type), ("label", pa.int64()), ("text", pa.string()),
                    ("meta", meta_type)]).with_metadata(
    {"huggingface": json.dumps({"info": {"features": features}})})
os.makedirs(out, exist_ok=True)
shards = 2
per = (len(rows) + shards - 1) // shards
for s in range(shards):
    items = []
    for i in range(s * per, min((s + 1) * per, len(rows))):
        rel, label = rows[i]
        items.append({"image": {"bytes": open(os.path.join(images, rel), "rb").read(), "path": rel},
                      "label": label,
                      "text": f"a photo of a {classes[label]}, sample {i}, taken outdoors in daylight",
                      "meta": {"id": i, "source": rel, "width": 500, "height": 375,
                               "boxes": [[10.5, 20.0, 100.0, 80.0 + i % 7]],
                               "tags": ["synthetic", classes[label]]}})
    pq.write_table(pa.Table.from_pylist(items, schema=schema),
                   os.path.join(out, f"train-{s:05d}-of-{shards:05d}.parquet"), row_group_size=100)
print(len(rows))
"#;

/// The shards of the bench's image folder (written once, next to it).
fn write_shards(root: &Path, n: u32) -> Result<PathBuf> {
    super::parquet::write_copy(root, "wds-fields", WRITER, "WebDataset shards", n)
}

/// Runs the comparisons and returns their markdown.
pub(super) fn run(ctx: &Ctx, n: u32) -> Result<String> {
    let shards = write_shards(&ctx.root, n)?;
    super::super::warm_page_cache(&shards)?;
    let parquet = super::parquet::write_copy(
        &ctx.root,
        "parquet-fields",
        PQ_WRITER,
        "Parquet files with fields (does python3 import pyarrow? pip install pyarrow)",
        n,
    )?;
    super::super::warm_page_cache(&parquet)?;
    let roots = [ctx.root.clone(), shards.clone(), parquet.clone()];
    let sc = Scenario {
        name: format!("fields K={K}"),
        jobs: (0..K)
            .map(|_| JobPlan {
                subset: 0..n,
                sleep_ms: 0.0,
                start_frac: 0.0,
            })
            .collect(),
        batch: 16,
    };
    let plain = json!({"kind": "tar_shards", "paths": [shards]});
    let fields = json!({"kind": "tar_shards", "paths": [shards], "fields": {
        "image": {"kind": "image", "from": "jpg"},
        "label": {"kind": "class", "from": "cls"},
        "caption": {"kind": "text", "from": "txt"},
        "meta": {"kind": "json", "from": "json"},
    }});
    let (without, with) = rounds(
        ctx,
        &sc,
        &roots,
        "fd",
        ("joader serve, image + class", &plain),
        ("joader serve, + caption + json", &fields),
    )?;
    let mut out = report(&sc, "the same WebDataset shards", &without, &with);
    let plain = json!({"kind": "parquet", "paths": [parquet]});
    let fields = json!({"kind": "parquet", "paths": [parquet], "fields": {
        "image": {"kind": "image"},
        "label": {"kind": "class"},
        "caption": {"kind": "text", "from": "text"},
        "meta": {"kind": "json"},
    }});
    let (without, with) = rounds(
        ctx,
        &sc,
        &roots,
        "fp",
        ("joader serve, parquet image + class", &plain),
        ("joader serve, parquet + caption + struct", &fields),
    )?;
    out.push_str(&report(
        &sc,
        "the same Parquet files: a string column and a struct column",
        &without,
        &with,
    ));
    Ok(out)
}

fn report(sc: &Scenario, files: &str, without: &[Row], with: &[Row]) -> String {
    let heading = format!(
        "Samples with a caption and a JSON document against the same images without ({}, {} \
         rounds interleaved, {files})",
        sc.name,
        without.len()
    );
    let (mut out, ratio, cpu) = paired(&heading, "declaration", "without", without, with);
    out.push_str(&format!(
        "\nwith fields / without, mean of the rounds: throughput {ratio:.3}x, server CPU per \
         sample {cpu:.3}x\n"
    ));
    out
}
