//! Fuzz targets of the parsers that read what users hand the server as a dataset: manifests
//! (CSV and JSON lines) and tar shards. Under `cargo test` each runs a short bounded random
//! search (bolero's test engine) as part of the test command; for long runs on nightly,
//! `cargo bolero test -p joader-storage fuzz::<name>` drives the same target with libFuzzer.
//! The property is always the same: any input gives a value or an error, never a panic, and
//! a value is well-formed.

use std::path::{Path, PathBuf};

use bolero::check;

use crate::{self as storage, Location, SourceSpec};

/// Inputs tried per target in the test command (a few seconds in all).
const ITERATIONS: usize = 2_000;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("joader-fuzz-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        // Two real files a fuzzed manifest can name.
        std::fs::write(p.join("a.jpg"), b"a").unwrap();
        std::fs::write(p.join("b.jpg"), b"b").unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Indexes `bytes` written as `name` in `dir`; checks what an index must be.
fn index_as(dir: &Path, name: &str, bytes: &[u8], spec: SourceSpec) {
    std::fs::write(dir.join(name), bytes).unwrap();
    if let Ok(index) = storage::index(&spec, &[dir.to_path_buf()], &mut |_| {}) {
        for id in 0..index.len() as u32 {
            match index.location(id).unwrap() {
                Location::File(p) => assert!(p.starts_with(dir), "{p:?} escaped the root"),
                Location::TarMember { shard, offset, len } => {
                    let shard = &index.shards()[shard as usize];
                    let size = std::fs::metadata(shard).unwrap().len();
                    assert!(offset + len <= size, "member past the end of {shard:?}");
                }
                Location::ParquetRow { .. } | Location::ArrayRow { .. } => {
                    panic!("a Parquet or array row from a tar or manifest")
                }
            }
        }
    }
}

#[test]
fn manifests_never_panic() {
    let dir = Scratch::new("manifest");
    // Seeds: valid lines mixed with bytes, so that the search reaches the field parsing.
    check!()
        .with_type::<(Vec<u8>, u8)>()
        .with_iterations(ITERATIONS)
        .for_each(|(noise, shape)| {
            let mut text = match shape % 4 {
                0 => b"path,label\na.jpg,1\n\"b.jpg\",cat\n".to_vec(),
                1 => b"{\"path\": \"a.jpg\", \"label\": 3}\n".to_vec(),
                2 => b"a.jpg,\"x\"\"y\"\n../b.jpg,2\n".to_vec(),
                _ => Vec::new(),
            };
            text.extend_from_slice(noise);
            index_as(
                &dir.0,
                "m.csv",
                &text,
                SourceSpec::Manifest {
                    path: dir.0.join("m.csv"),
                    format: None,
                    fields: None,
                },
            );
            index_as(
                &dir.0,
                "m.jsonl",
                &text,
                SourceSpec::Manifest {
                    path: dir.0.join("m.jsonl"),
                    format: None,
                    fields: None,
                },
            );
        });
}

/// A valid two-sample WebDataset shard to mutate.
fn shard_seed() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("s0.jpg", &b"jpegbytes"[..]),
        ("s0.cls", b"1"),
        ("s1.png", b"pngbytes"),
        ("s1.cls", b"0"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn tar_shards_never_panic() {
    let dir = Scratch::new("tar");
    let seed = shard_seed();
    check!()
        .with_type::<(Vec<(u16, u8)>, u16)>()
        .with_iterations(ITERATIONS)
        .for_each(|(edits, cut)| {
            let mut bytes = seed.clone();
            for &(at, v) in edits {
                let n = bytes.len();
                bytes[usize::from(at) % n] = v;
            }
            bytes.truncate(usize::from(*cut).max(1).min(bytes.len()));
            index_as(
                &dir.0,
                "shard.tar",
                &bytes,
                SourceSpec::TarShards {
                    paths: vec![dir.0.join("shard.tar")],
                    fields: None,
                },
            );
        });
}

/// `.npy` headers come from the dataset's files: any bytes give a shape or an error, never a
/// panic, and a shape accepted is one whose data the bytes hold exactly.
#[test]
fn npy_headers_never_panic() {
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    let mut seed = b"\x93NUMPY\x01\x00".to_vec();
    seed.extend_from_slice(&(header.len() as u16).to_le_bytes());
    seed.extend_from_slice(header.as_bytes());
    seed.extend(std::iter::repeat_n(0u8, 24));
    check!()
        .with_type::<(Vec<(u8, u8)>, u8)>()
        .with_iterations(ITERATIONS)
        .for_each(|(edits, cut)| {
            let mut bytes = seed.clone();
            for &(at, v) in edits {
                let n = bytes.len();
                bytes[usize::from(at) % n] = v;
            }
            bytes.truncate(bytes.len() - usize::from(*cut) % 8);
            if let Ok(shape) = crate::fields::npy_shape(&bytes) {
                assert!(shape.iter().product::<u64>() <= bytes.len() as u64);
            }
        });
}
