//! Shared-memory object names.
//!
//! Every object of an instance lives in `/dev/shm` under the prefix
//! `joader-<instance>-`, so that two servers (or parallel tests) with
//! different instance names never collide, and a restarted server can find
//! and remove exactly its own stale objects. Instance names may not contain
//! `-`, which keeps the prefix unambiguous (`joader-a-` never matches an
//! object of instance `a-b`).

use crate::error::{Error, Result};

/// Directory where POSIX shared memory objects live on Linux.
pub const SHM_DIR: &str = "/dev/shm";

const MAX_INSTANCE_LEN: usize = 64;
const MAX_RING_LEN: usize = 128;

/// Checks an instance name: 1..=64 characters from `[A-Za-z0-9_.]`.
pub fn validate_instance(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_INSTANCE_LEN {
        return Err(Error::InvalidName {
            name: name.into(),
            reason: "instance names have 1 to 64 characters",
        });
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        || name.starts_with('.')
    {
        return Err(Error::InvalidName {
            name: name.into(),
            reason: "instance names use only ASCII letters, digits, '_' and '.' (no '-'), and do not start with '.'",
        });
    }
    Ok(())
}

/// Checks a ring name: 1..=128 characters from `[A-Za-z0-9_.-]`.
pub fn validate_ring(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_RING_LEN {
        return Err(Error::InvalidName {
            name: name.into(),
            reason: "ring names have 1 to 128 characters",
        });
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        || name.starts_with('.')
    {
        return Err(Error::InvalidName {
            name: name.into(),
            reason: "ring names use only ASCII letters, digits, '_', '.' and '-', and do not start with '.'",
        });
    }
    Ok(())
}

/// Prefix shared by every object of `instance`.
pub fn instance_prefix(instance: &str) -> String {
    format!("joader-{instance}-")
}

/// Name of the data segment of `instance` (`joader-<instance>-data`).
pub fn data_segment(instance: &str) -> String {
    format!("joader-{instance}-data")
}

/// Name of the instance lock file (`joader-<instance>-lock`), held by the live server.
pub fn lock_file(instance: &str) -> String {
    format!("joader-{instance}-lock")
}

/// Name of the ring segment `ring` of `instance` (`joader-<instance>-ring-<ring>`).
pub fn ring_segment(instance: &str, ring: &str) -> String {
    format!("joader-{instance}-ring-{ring}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        assert!(validate_instance("default").is_ok());
        assert!(validate_instance("t_123.x").is_ok());
        for bad in ["", "a-b", "a/b", ".x", "é", &"x".repeat(65)] {
            let err = validate_instance(bad).unwrap_err();
            assert_eq!(err.code(), "invalid_name", "{bad:?}");
        }
    }

    #[test]
    fn ring_names() {
        assert!(validate_ring("job-1.r0").is_ok());
        for bad in ["", "a/b", "..", "a b", &"x".repeat(129)] {
            assert!(validate_ring(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefixes_do_not_overlap() {
        // The property that makes stale-segment cleanup safe.
        assert!(!data_segment("a_b").starts_with(&instance_prefix("a")));
        assert!(ring_segment("a", "x-y").starts_with(&instance_prefix("a")));
        assert!(!ring_segment("ab", "x").starts_with(&instance_prefix("a")));
    }
}
