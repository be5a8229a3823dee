//! `joader bench …`: commands that measure and print figures side by side in one run.
//! Benchmarks never assert timings; they print what they measured and the targets.

pub mod cluster;
pub mod decode;
pub mod e2e;
pub mod photos;
pub mod sampler;
pub mod scale;

/// Reads every file under `dir` once (so that it sits in the page cache); returns the bytes read.
pub(crate) fn warm_page_cache(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += warm_page_cache(&entry.path())?;
        } else if kind.is_file() {
            total += std::io::copy(
                &mut std::fs::File::open(entry.path())?,
                &mut std::io::sink(),
            )?;
        }
    }
    Ok(total)
}
