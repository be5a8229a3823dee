//! Recorded delivery orders: a job registered with `record: true` has every delivery the
//! Sampler decides for it, `(epoch, position, element)` in sampled order, sent after each pass
//! through a bounded channel (never a wait on the Sampler: a lagging recorder drops and counts,
//! `JobStats::record_dropped`) to a thread of its own that appends it to
//! `<data dir>/records/<job>/<epoch>.rec` (little-endian `u32` pairs: position, element) and
//! keeps the last [`EPOCHS_KEPT`] epochs. A rank's share is the positions `p` with
//! `p % world_size == rank`, in order: what that rank's ring received. The files outlive the job
//! (a bad batch can be traced after a crash) until a job of the same name records again.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::error::{Code, Error, Result};

/// Epochs whose orders are kept per job (older ones are deleted as new ones start).
pub const EPOCHS_KEPT: u32 = 16;
/// Passes the channel buffers before the Sampler drops records (a pass gives a job at most its
/// credit plus one batch per rank: a few batches, 12 bytes a delivery).
const CHANNEL_PASSES: usize = 256;

/// The folder of a job's recorded epochs.
pub fn dir(data_dir: &Path, job: &str) -> PathBuf {
    data_dir.join("records").join(job)
}

fn epoch_file(dir: &Path, epoch: u32) -> PathBuf {
    dir.join(format!("{epoch}.rec"))
}

/// Starts recording a job (what an earlier job of this name recorded is removed) and returns
/// the Sampler's end of the channel.
pub fn start(dir: PathBuf, world_size: u32) -> std::io::Result<SyncSender<Vec<[u32; 3]>>> {
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("world_size"), world_size.to_string())?;
    let (tx, rx) = sync_channel(CHANNEL_PASSES);
    std::thread::Builder::new()
        .name("joader-record".into())
        .spawn(move || {
            if let Err(e) = write(&dir, rx) {
                tracing::warn!(dir = %dir.display(), error = %e, "recording stopped");
            }
        })?;
    Ok(tx)
}

/// Appends what arrives until the Sampler forgets the job (the channel closes).
fn write(dir: &Path, rx: Receiver<Vec<[u32; 3]>>) -> std::io::Result<()> {
    let mut open: BTreeMap<u32, BufWriter<File>> = BTreeMap::new();
    for deliveries in rx {
        for [epoch, position, element] in deliveries {
            if !open.contains_key(&epoch) {
                // A new epoch: the earlier ones are complete.
                for (_, mut f) in std::mem::take(&mut open) {
                    f.flush()?;
                }
                if let Some(old) = epoch.checked_sub(EPOCHS_KEPT) {
                    let _ = std::fs::remove_file(epoch_file(dir, old));
                }
                let f = File::options()
                    .create(true)
                    .append(true)
                    .open(epoch_file(dir, epoch))?;
                open.insert(epoch, BufWriter::new(f));
            }
            let f = open.get_mut(&epoch).expect("opened above");
            f.write_all(&position.to_le_bytes())?;
            f.write_all(&element.to_le_bytes())?;
        }
        // Readable as soon as the pass is recorded.
        for f in open.values_mut() {
            f.flush()?;
        }
    }
    Ok(())
}

/// A recorded epoch: element ids by position, from the first recorded position on.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The recording job's ranks (rank `r` received the positions `p % world_size == r`).
    pub world_size: u32,
    /// The epoch's first recorded position (0, or where a resumed job started).
    pub first: u32,
    pub order: Vec<u32>,
}

/// Reads a recorded epoch of a job.
pub fn read(data_dir: &Path, job: &str, epoch: u32) -> Result<Recorded> {
    let path = epoch_file(&dir(data_dir, job), epoch);
    let bytes = std::fs::read(&path).map_err(|_| {
        Error::new(
            Code::RecordNotFound,
            format!(
                "no recorded epoch {epoch} of job '{job}': the job did not set record, has not \
                 reached that epoch, or it is older than the last {EPOCHS_KEPT}"
            ),
        )
    })?;
    let mut pairs: Vec<(u32, u32)> = bytes
        .chunks_exact(8)
        .map(|c| {
            let w = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            (w(0), w(4))
        })
        .collect();
    pairs.sort_unstable_by_key(|p| p.0);
    let first = pairs.first().map_or(0, |p| p.0);
    if pairs
        .iter()
        .enumerate()
        .any(|(i, p)| p.0 != first + i as u32)
    {
        return Err(Error::new(
            Code::RecordNotFound,
            format!(
                "the record of epoch {epoch} of job '{job}' has gaps: the recorder lagged \
                 (see the job's record_dropped)"
            ),
        ));
    }
    let world_size = std::fs::read_to_string(dir(data_dir, job).join("world_size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1);
    Ok(Recorded {
        world_size,
        first,
        order: pairs.into_iter().map(|p| p.1).collect(),
    })
}

impl Recorded {
    /// Rank `r`'s share, in the order its ring received it.
    pub fn ranks(&self) -> Vec<Vec<u32>> {
        let w = self.world_size.max(1);
        let mut out = vec![Vec::new(); w as usize];
        for (i, &e) in self.order.iter().enumerate() {
            out[((self.first + i as u32) % w) as usize].push(e);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_written_by_epoch_and_read_back_in_position_order() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dir(tmp.path(), "j");
        let tx = start(d.clone(), 2).unwrap();
        tx.send(vec![[0, 0, 5], [0, 1, 3]]).unwrap();
        tx.send(vec![[0, 2, 9], [1, 0, 3], [1, 1, 9]]).unwrap();
        drop(tx);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let got = loop {
            match read(tmp.path(), "j", 1) {
                Ok(r) if r.order.len() == 2 => break r,
                _ => assert!(std::time::Instant::now() < deadline, "not written"),
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(got.order, vec![3, 9]);
        let e0 = read(tmp.path(), "j", 0).unwrap();
        assert_eq!((e0.world_size, e0.first, e0.order), (2, 0, vec![5, 3, 9]));
        let e = read(tmp.path(), "j", 2).unwrap_err();
        assert_eq!(e.code, Code::RecordNotFound);
    }
}
