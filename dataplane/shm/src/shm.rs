//! POSIX shared-memory objects and their mappings: the only place that turns
//! file descriptors into raw pointers.
//!
//! We use `rustix` directly (`rustix::shm`, `rustix::mm`, `rustix::fs`):
//! exclusive creation with mode 0600, `ftruncate` + `fallocate` (so that a
//! too-small `/dev/shm` fails at creation with a clear error instead of a
//! `SIGBUS` on first touch), `flock` for liveness, and `mmap` with a
//! protection chosen per mapping (clients map the data segment read-only).
//!
//! A [`Mapping`] hands out typed accessors at byte offsets. Every accessor
//! checks bounds and alignment and panics on violation: offsets computed from
//! untrusted header fields are validated by the callers first (see
//! `layout.rs`), so a panic here is a bug in this crate, never the peer's
//! fault.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{FallocateFlags, FlockOperation, Mode};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm::OFlags;

use crate::error::{Error, Result};
use crate::names::SHM_DIR;

/// Who may open the objects clients open (the data segment and the rings) besides the
/// server's user: their mode (`0o600` by default; `0o660` lets a group in) and their group
/// (the server's own by default). Training processes that run under another user open them
/// through the group (Kubernetes: `supplementalGroups`) or the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Permission bits; the owner's read and write are always kept.
    pub mode: u32,
    /// Group id the objects are given (`fchown`); the server's user must belong to it.
    pub gid: Option<u32>,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            mode: 0o600,
            gid: None,
        }
    }
}

/// Creates `name` exclusively (`O_CREAT | O_EXCL`) with `size` bytes, after
/// checking that `/dev/shm` has room for it, then gives it `access`'s mode
/// (`fchmod`, so the umask does not narrow it) and group. With `reserve`,
/// the pages are allocated up front (`fallocate`), so later stores cannot
/// fault with `SIGBUS` when `/dev/shm` fills up.
pub(crate) fn create_exclusive(
    name: &str,
    size: u64,
    reserve: bool,
    access: Access,
) -> Result<OwnedFd> {
    check_free_space(name, size)?;
    let fd = rustix::shm::open(
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|e| match e {
        Errno::EXIST => Error::AlreadyExists { name: name.into() },
        e => Error::io("shm_open(create)", name, e),
    })?;
    let permitted = (|| {
        if access.mode != 0o600 {
            let mode = Mode::from_bits_truncate((access.mode | 0o600) & 0o666);
            rustix::fs::fchmod(&fd, mode).map_err(|e| Error::io("fchmod", name, e))?;
        }
        if let Some(gid) = access.gid {
            // The kernel checks that the server's user belongs to the group (EPERM).
            let gid = rustix::fs::Gid::from_raw(gid);
            rustix::fs::fchown(&fd, None, Some(gid)).map_err(|e| Error::io("fchown", name, e))?;
        }
        Ok(())
    })();
    if let Err(e) = permitted {
        let _ = rustix::shm::unlink(name);
        return Err(e);
    }
    let sized = rustix::fs::ftruncate(&fd, size)
        .map_err(|e| Error::io("ftruncate", name, e))
        .and_then(|()| {
            if !reserve {
                return Ok(());
            }
            match rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, size) {
                Ok(()) | Err(Errno::OPNOTSUPP) => Ok(()),
                Err(Errno::NOSPC) => Err(Error::ShmSpace {
                    path: SHM_DIR,
                    name: name.into(),
                    requested: size,
                    free: free_space().unwrap_or(0),
                }),
                Err(e) => Err(Error::io("fallocate", name, e)),
            }
        });
    if let Err(e) = sized {
        let _ = rustix::shm::unlink(name);
        return Err(e);
    }
    Ok(fd)
}

/// Creates or opens a plain lock object (mode 0600), never exclusive.
pub(crate) fn open_or_create_lock(name: &str) -> Result<OwnedFd> {
    rustix::shm::open(name, OFlags::CREATE | OFlags::RDWR, Mode::RUSR | Mode::WUSR)
        .map_err(|e| Error::io("shm_open(lock)", name, e))
}

/// Opens an existing object, read-write or read-only.
pub(crate) fn open_existing(name: &str, writable: bool) -> Result<OwnedFd> {
    let flags = if writable {
        OFlags::RDWR
    } else {
        OFlags::RDONLY
    };
    rustix::shm::open(name, flags, Mode::empty()).map_err(|e| match e {
        Errno::NOENT => Error::NotFound { name: name.into() },
        e => Error::io("shm_open", name, e),
    })
}

/// Removes the name (existing mappings stay valid).
pub(crate) fn unlink(name: &str) -> std::io::Result<()> {
    rustix::shm::unlink(name).map_err(Into::into)
}

/// Size of the object behind `fd`.
pub(crate) fn size_of(fd: impl AsFd, name: &str) -> Result<u64> {
    let st = rustix::fs::fstat(fd).map_err(|e| Error::io("fstat", name, e))?;
    Ok(st.st_size as u64)
}

/// (device, inode) of the object behind `fd`.
pub(crate) fn identity(fd: impl AsFd) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// (device, inode) of the object currently named `name`, if any.
pub(crate) fn identity_of_name(name: &str) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::stat(format!("{SHM_DIR}/{name}"))?;
    Ok((st.st_dev, st.st_ino))
}

/// Bytes of `/dev/shm` available to us.
pub(crate) fn free_space() -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(SHM_DIR)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Fails with [`Error::ShmSpace`] when `/dev/shm` cannot hold `size` more bytes.
pub(crate) fn check_free_space(name: &str, size: u64) -> Result<()> {
    let free = free_space().map_err(|e| Error::io("statvfs", SHM_DIR, e))?;
    if free < size {
        return Err(Error::ShmSpace {
            path: SHM_DIR,
            name: name.into(),
            requested: size,
            free,
        });
    }
    Ok(())
}

/// Tries to take a `flock` without blocking. `Ok(false)` when another open
/// file description holds a conflicting lock.
pub(crate) fn try_flock(fd: impl AsFd, exclusive: bool) -> std::io::Result<bool> {
    let op = if exclusive {
        FlockOperation::NonBlockingLockExclusive
    } else {
        FlockOperation::NonBlockingLockShared
    };
    match rustix::fs::flock(fd, op) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Releases a `flock` held through `fd`'s open file description.
pub(crate) fn unflock(fd: impl AsFd) -> std::io::Result<()> {
    rustix::fs::flock(fd, FlockOperation::Unlock).map_err(Into::into)
}

/// A shared mapping of part of a shared-memory object.
///
/// Memory behind a mapping is shared with other processes, so it is only
/// accessed through atomics, volatile reads and writes, or byte slices whose
/// exclusivity is guaranteed by the protocol (see `DESIGN.md`).
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a Mapping is a plain region of shared memory; all accesses go
// through atomics or through the protocol-level exclusivity documented on
// each accessor, which does not depend on the thread doing the access.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes atomic/volatile accessors and
// byte slices that the protocol keeps free of concurrent writes.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .finish()
    }
}

impl Mapping {
    /// Maps `len` bytes at `offset` (a multiple of the page size) of `fd`.
    pub(crate) fn map(
        fd: impl AsFd,
        name: &str,
        offset: u64,
        len: usize,
        writable: bool,
    ) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::Corrupt {
                name: name.into(),
                reason: "zero-length mapping".into(),
            });
        }
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: we ask the kernel for a fresh shared mapping at an address
        // of its choosing (null hint, no MAP_FIXED), so no existing memory is
        // replaced; the result is checked by rustix (MAP_FAILED -> Err).
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                MapFlags::SHARED,
                fd,
                offset,
            )
        }
        .map_err(|e| Error::io("mmap", name, e))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| Error::Corrupt {
            name: name.into(),
            reason: "mmap returned null".into(),
        })?;
        Ok(Mapping { ptr, len, writable })
    }

    fn check(&self, off: usize, size: usize, align: usize) {
        assert!(
            off.checked_add(size).is_some_and(|end| end <= self.len),
            "shm access out of bounds: {off}+{size} > {}",
            self.len
        );
        assert!(
            (self.ptr.as_ptr() as usize + off).is_multiple_of(align),
            "misaligned shm access at {off}"
        );
    }

    /// The 32-bit atomic at `off`.
    pub(crate) fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: in bounds and 4-aligned (checked above); the memory lives
        // as long as `self` and is only ever accessed atomically by both sides.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The 64-bit atomic at `off`.
    pub(crate) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: in bounds and 8-aligned (checked above); the memory lives
        // as long as `self` and is only ever accessed atomically by both sides.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Volatile read of a plain `u32` field.
    pub(crate) fn read_u32(&self, off: usize) -> u32 {
        self.check(off, 4, 4);
        // SAFETY: in bounds and aligned; volatile because another process may
        // have written it (publication is ordered by an Acquire load before).
        unsafe { self.ptr.as_ptr().add(off).cast::<u32>().read_volatile() }
    }

    /// Volatile read of a plain `u64` field.
    pub(crate) fn read_u64(&self, off: usize) -> u64 {
        self.check(off, 8, 8);
        // SAFETY: as in `read_u32`.
        unsafe { self.ptr.as_ptr().add(off).cast::<u64>().read_volatile() }
    }

    /// Volatile write of a plain `u32` field (writable mappings only).
    pub(crate) fn write_u32(&self, off: usize, v: u32) {
        assert!(self.writable, "write to a read-only mapping");
        self.check(off, 4, 4);
        // SAFETY: in bounds, aligned, mapped writable; the protocol gives the
        // writer exclusive ownership of this field while it writes it.
        unsafe { self.ptr.as_ptr().add(off).cast::<u32>().write_volatile(v) }
    }

    /// Volatile write of a plain `u64` field (writable mappings only).
    pub(crate) fn write_u64(&self, off: usize, v: u64) {
        assert!(self.writable, "write to a read-only mapping");
        self.check(off, 8, 8);
        // SAFETY: as in `write_u32`.
        unsafe { self.ptr.as_ptr().add(off).cast::<u64>().write_volatile(v) }
    }

    /// Borrows `len` bytes at `off`.
    ///
    /// The protocol guarantees that nobody writes these bytes while the
    /// borrow lives: a payload is only read by readers whose read bit pins
    /// the slot, and a pinned slot is never reused (invariant I3).
    pub(crate) fn bytes(&self, off: usize, len: usize) -> &[u8] {
        if len == 0 {
            return &[];
        }
        self.check(off, len, 1);
        // SAFETY: in bounds (checked); valid for the lifetime of `self`;
        // absence of concurrent writers is the protocol invariant above.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Mutable view of `len` bytes at `off` (writable mappings only).
    ///
    /// # Safety
    /// The caller must own the region exclusively for the lifetime of the
    /// returned slice: no other reference to these bytes may exist in this
    /// process and no peer may read or write them (e.g. an allocated arena
    /// block whose slot is not yet published).
    // The exclusivity that `&mut` needs comes from the protocol, not from `&self`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(self.writable, "write to a read-only mapping");
        if len == 0 {
            return &mut [];
        }
        self.check(off, len, 1);
        // SAFETY: in bounds and writable (checked); exclusivity is the
        // caller's obligation stated above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` come from a successful mmap that nothing else
        // unmaps, and every reference handed out borrows `self`, so none
        // outlives this call.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) };
    }
}
