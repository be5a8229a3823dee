//! An instance's objects in `/dev/shm` and who may touch them: the instance lock (a `flock`ed
//! object its server holds for its lifetime; only the holder creates or removes the instance's
//! objects), and the removal of what a dead server left (at a restart, or by `joader cleanup`).

use std::os::fd::OwnedFd;

use crate::error::{Error, Result};
use crate::{names, shm};

/// The instance lock: a `flock`ed object held for the server's lifetime. Only
/// its holder may create or remove objects of the instance.
#[derive(Debug)]
pub(crate) struct InstanceLock {
    pub(crate) name: String,
    fd: OwnedFd,
}

impl InstanceLock {
    pub(crate) fn acquire(instance: &str) -> Result<InstanceLock> {
        let name = names::lock_file(instance);
        for _ in 0..10 {
            let fd = shm::open_or_create_lock(&name)?;
            if !shm::try_flock(&fd, true).map_err(|e| Error::io("flock", &name, e))? {
                return Err(Error::InstanceInUse {
                    instance: instance.into(),
                });
            }
            // The previous holder may have unlinked the name between our open
            // and our flock: then we locked an orphan inode; retry on the new name.
            let ours = shm::identity(&fd).map_err(|e| Error::io("fstat", &name, e))?;
            if shm::identity_of_name(&name).ok() == Some(ours) {
                return Ok(InstanceLock { name, fd });
            }
        }
        Err(Error::InstanceInUse {
            instance: instance.into(),
        })
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock; a process that opened the old
        // inode will notice the identity mismatch and retry.
        if shm::identity(&self.fd).ok() == shm::identity_of_name(&self.name).ok() {
            let _ = shm::unlink(&self.name);
        }
    }
}

/// Removes what a dead server of `instance` left in `/dev/shm` (its data segment and rings,
/// then its lock) and returns their names, without starting a server: what a restart does
/// first, for an instance that will not be restarted (a server killed by SIGKILL or the OOM
/// killer cannot remove them itself). Fails with `instance_in_use` while a live server holds
/// the instance, and removes nothing then: it holds the instance lock, and its data segment
/// locked exclusively (checked too, in case the lock file of a live server was removed).
pub fn remove_dead_instance(instance: &str) -> Result<Vec<String>> {
    names::validate_instance(instance)?;
    let lock = InstanceLock::acquire(instance)?;
    let data = names::data_segment(instance);
    if let Ok(fd) = shm::open_existing(&data, false)
        && !shm::try_flock(&fd, false).map_err(|e| Error::io("flock", &data, e))?
    {
        return Err(Error::InstanceInUse {
            instance: instance.into(),
        });
    }
    let mut removed = remove_stale_objects(instance, &lock.name);
    removed.push(lock.name.clone());
    // Dropping the lock unlinks its file.
    drop(lock);
    Ok(removed)
}

/// Removes every object named `joader-<instance>-*` except the lock. Only
/// called while holding the instance lock, so none of them belongs to a live
/// server.
pub(crate) fn remove_stale_objects(instance: &str, lock_name: &str) -> Vec<String> {
    let prefix = names::instance_prefix(instance);
    let mut removed = Vec::new();
    let Ok(dir) = std::fs::read_dir(names::SHM_DIR) else {
        return removed;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name != lock_name && shm::unlink(&name).is_ok() {
            removed.push(name);
        }
    }
    removed.sort();
    removed
}
