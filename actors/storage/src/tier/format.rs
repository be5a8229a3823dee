//! The on-disk form of one stored object (an element's encoded bytes): a file named by the
//! 128-bit xxh3 hash of its identity ([`TierKey`]), under a fan-out folder of 256, holding a
//! header (magic, lengths, the xxh3-64 checksum of identity and payload, the identity) and
//! the payload.
//!
//! A file is written under a temporary name in `tmp/` and renamed into place when complete,
//! so a name in `objects/` always held a whole file once. Data is not synced (the tier is a
//! cache): after a power loss a renamed file may be short or hold garbage, which the length
//! check at start-up or the checksum at read time finds, and the object is fetched again.

use std::fs::File;
use std::hash::Hasher as _;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use twox_hash::{XxHash3_64, XxHash3_128};

/// The first bytes of every stored object (the format's version is its last digit).
pub const MAGIC: &[u8; 8] = b"JDTIER01";

/// Bytes before the identity: magic, identity length (u32), payload length (u64), checksum
/// (u64), all little-endian.
pub const FIXED: usize = 8 + 4 + 8 + 8;

/// An identity longer than this is not a stored object's (a damaged header).
const MAX_IDENTITY: usize = 16 << 10;

/// What an element's bytes are: an object of a store, at one ETag, whole or one byte range.
/// Two datasets reading the same bytes share the stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierKey {
    /// The store: its endpoint (or `aws`) and bucket.
    pub store: String,
    /// The object's key in the store.
    pub object: String,
    /// The ETag the index recorded for the object: a changed object is another key.
    pub etag: String,
    /// The bytes of the object the element is (a tar member), or `None` for all of them.
    pub range: Option<Range<u64>>,
    /// A part of the object that is no byte range: a Parquet row (its row group and row, and
    /// the small columns its dataset declares, which its stored bytes carry).
    pub part: Option<String>,
}

impl TierKey {
    /// The bytes a stored object's header carries, and its name is hashed from (a key
    /// without a `part` has the identity it had before parts were kept).
    pub fn identity(&self) -> Vec<u8> {
        let range = match &self.range {
            Some(r) => format!("{}-{}", r.start, r.end),
            None => "all".into(),
        };
        let mut id = format!("{}\n{}\n{}\n{}", self.store, self.object, self.etag, range);
        if let Some(part) = &self.part {
            id.push('\n');
            id.push_str(part);
        }
        id.into_bytes()
    }

    /// The stored object's name.
    pub fn name(&self) -> u128 {
        XxHash3_128::oneshot(&self.identity())
    }
}

/// Where the object named `name` lives under the tier's `objects/` folder.
pub fn object_path(objects: &Path, name: u128) -> PathBuf {
    let hex = format!("{name:032x}");
    objects.join(&hex[..2]).join(hex)
}

/// The name a path under `objects/` holds, if it is one of ours.
pub fn name_of(path: &Path) -> Option<u128> {
    let file = path.file_name()?.to_str()?;
    let parent = path.parent()?.file_name()?.to_str()?;
    if file.len() != 32 || !file.starts_with(parent) {
        return None;
    }
    u128::from_str_radix(file, 16).ok()
}

fn checksum(identity: &[u8], payload: &[u8]) -> u64 {
    let mut h = XxHash3_64::new();
    h.write(identity);
    h.write(payload);
    h.finish()
}

/// The length of the file that stores `payload_len` bytes under `key`.
pub fn encoded_len(key: &TierKey, payload_len: u64) -> u64 {
    (FIXED + key.identity().len()) as u64 + payload_len
}

/// The whole file of a stored object.
pub fn encode(key: &TierKey, payload: &[u8]) -> Vec<u8> {
    let identity = key.identity();
    let mut out = Vec::with_capacity(FIXED + identity.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(&identity, payload).to_le_bytes());
    out.extend_from_slice(&identity);
    out.extend_from_slice(payload);
    out
}

/// A stored object's header, read without its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub identity: Vec<u8>,
    pub payload_len: u64,
    pub checksum: u64,
}

impl Header {
    /// The length of the whole file this header describes.
    pub fn file_len(&self) -> u64 {
        (FIXED + self.identity.len()) as u64 + self.payload_len
    }
}

/// Why a stored object cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    #[error("not a stored object (bad magic or header)")]
    Header,
    #[error("torn: the file holds {have} bytes, its header says {want}")]
    Length { have: u64, want: u64 },
    #[error("it stores another object (identity differs)")]
    Identity,
    #[error("checksum mismatch")]
    Checksum,
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn parse_fixed(fixed: &[u8; FIXED]) -> Result<(usize, u64, u64), Damage> {
    if &fixed[..8] != MAGIC {
        return Err(Damage::Header);
    }
    let id_len = u32::from_le_bytes(fixed[8..12].try_into().expect("4 bytes")) as usize;
    let payload_len = u64::from_le_bytes(fixed[12..20].try_into().expect("8 bytes"));
    let sum = u64::from_le_bytes(fixed[20..28].try_into().expect("8 bytes"));
    if id_len > MAX_IDENTITY {
        return Err(Damage::Header);
    }
    Ok((id_len, payload_len, sum))
}

/// Reads a stored object's header and checks the file's length against it (start-up: no
/// read of the payload).
pub fn read_header(path: &Path) -> Result<Header, Damage> {
    let mut f = File::open(path)?;
    let have = f.metadata()?.len();
    let mut fixed = [0u8; FIXED];
    f.read_exact(&mut fixed).map_err(|_| Damage::Length {
        have,
        want: FIXED as u64,
    })?;
    let (id_len, payload_len, checksum) = parse_fixed(&fixed)?;
    let mut identity = vec![0u8; id_len];
    f.read_exact(&mut identity).map_err(|_| Damage::Header)?;
    let header = Header {
        identity,
        payload_len,
        checksum,
    };
    if header.file_len() != have {
        return Err(Damage::Length {
            have,
            want: header.file_len(),
        });
    }
    Ok(header)
}

/// Reads a stored object and verifies it: its identity is `key`'s, its length its header's,
/// its checksum right. Returns the payload.
pub fn read_verified(path: &Path, key: &TierKey) -> Result<Vec<u8>, Damage> {
    let mut f = File::open(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let fixed: &[u8; FIXED] =
        bytes
            .get(..FIXED)
            .and_then(|b| b.try_into().ok())
            .ok_or(Damage::Length {
                have: bytes.len() as u64,
                want: FIXED as u64,
            })?;
    let (id_len, payload_len, sum) = parse_fixed(fixed)?;
    let want = (FIXED + id_len) as u64 + payload_len;
    if bytes.len() as u64 != want {
        return Err(Damage::Length {
            have: bytes.len() as u64,
            want,
        });
    }
    let identity = &bytes[FIXED..FIXED + id_len];
    if identity != key.identity().as_slice() {
        return Err(Damage::Identity);
    }
    let payload = &bytes[FIXED + id_len..];
    if checksum(identity, payload) != sum {
        return Err(Damage::Checksum);
    }
    bytes.drain(..FIXED + id_len);
    Ok(bytes)
}

/// Writes a stored object: the whole file under `tmp`, then renamed to `path`. Returns the
/// file's length.
pub fn write(tmp: &Path, path: &Path, key: &TierKey, payload: &[u8]) -> io::Result<u64> {
    let bytes = encode(key, payload);
    let result = (|| {
        let mut f = File::create(tmp)?;
        f.write_all(&bytes)?;
        drop(f);
        // The fan-out folder only: a tier folder removed under a running server is not
        // made again (its writes fail, and stop).
        if let Some(parent) = path.parent()
            && let Err(e) = std::fs::create_dir(parent)
            && e.kind() != io::ErrorKind::AlreadyExists
        {
            return Err(e);
        }
        std::fs::rename(tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result.map(|()| bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(range: Option<Range<u64>>) -> TierKey {
        TierKey {
            store: "http://127.0.0.1:9000/bkt".into(),
            object: "train/shard-0.tar".into(),
            etag: "\"abc\"".into(),
            range,
            part: None,
        }
    }

    #[test]
    fn an_object_round_trips_and_its_header_reads_alone() {
        let dir = tempfile::tempdir().unwrap();
        let k = key(Some(512..1024));
        let path = object_path(dir.path(), k.name());
        let len = write(&dir.path().join("t"), &path, &k, b"payload bytes").unwrap();
        assert_eq!(name_of(&path), Some(k.name()));
        let h = read_header(&path).unwrap();
        assert_eq!(h.file_len(), len);
        assert_eq!(h.identity, k.identity());
        assert_eq!(read_verified(&path, &k).unwrap(), b"payload bytes");
        assert!(!dir.path().join("t").exists(), "the temporary name is gone");
    }

    #[test]
    fn keys_differ_by_etag_and_range() {
        let a = key(Some(0..10));
        let mut b = a.clone();
        b.etag = "\"def\"".into();
        assert_ne!(a.name(), b.name());
        assert_ne!(a.name(), key(Some(0..11)).name());
        assert_ne!(a.name(), key(None).name());
    }

    #[test]
    fn a_part_is_another_key_and_no_part_keeps_the_names_stored_before_parts() {
        let whole = key(None);
        assert_eq!(
            whole.identity(),
            b"http://127.0.0.1:9000/bkt\ntrain/shard-0.tar\n\"abc\"\nall".to_vec(),
            "the identity of the keys the tier stored before parts existed"
        );
        let row = |part: &str| TierKey {
            part: Some(part.into()),
            ..key(None)
        };
        assert_ne!(row("row 0/1").name(), whole.name());
        assert_ne!(row("row 0/1").name(), row("row 0/2").name());
        assert_eq!(row("row 0/1").name(), row("row 0/1").name());
    }

    #[test]
    fn a_flipped_byte_a_torn_file_and_another_identity_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let k = key(None);
        let path = object_path(dir.path(), k.name());
        write(&dir.path().join("t"), &path, &k, &[7u8; 1000]).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(read_verified(&path, &k), Err(Damage::Checksum)));
        assert!(read_header(&path).is_ok(), "the header alone cannot see it");
        bytes.truncate(last);
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(read_header(&path), Err(Damage::Length { .. })));
        assert!(matches!(
            read_verified(&path, &k),
            Err(Damage::Length { .. })
        ));
        write(&dir.path().join("t"), &path, &key(Some(1..2)), b"x").unwrap();
        assert!(matches!(read_verified(&path, &k), Err(Damage::Identity)));
        std::fs::write(&path, b"JDTIER0").unwrap();
        assert!(read_header(&path).is_err());
    }
}
