//! Object versions: the key, size and ETag of each object an `s3` index was made of, stored
//! with the dataset so that a re-index can say what changed since ([`ObjectChanges`]).

use object_store::ObjectMeta;
use serde::{Deserialize, Serialize};

/// An object as indexed: what a re-index compares.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectVersion {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
}

impl ObjectVersion {
    pub(super) fn of(meta: &ObjectMeta) -> Self {
        Self {
            key: meta.location.to_string(),
            size: meta.size,
            etag: meta.e_tag.clone(),
        }
    }

    /// The compact stored form of a dataset's objects (postcard).
    pub fn encode_all(objects: &[ObjectVersion]) -> Vec<u8> {
        postcard::to_allocvec(objects).unwrap_or_default()
    }

    pub fn decode_all(bytes: &[u8]) -> Result<Vec<ObjectVersion>, String> {
        postcard::from_bytes(bytes).map_err(|e| e.to_string())
    }
}

/// At most this many keys of each kind are named in [`ObjectChanges`] (the counts are whole).
pub const CHANGES_LISTED: usize = 100;

/// What a re-index found: objects added, removed, and changed (another size or ETag) since
/// the previous index.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ObjectChanges {
    pub added: u64,
    pub removed: u64,
    pub changed: u64,
    pub unchanged: u64,
    /// The first keys added, removed and changed (at most 100 of each, sorted).
    pub added_keys: Vec<String>,
    pub removed_keys: Vec<String>,
    pub changed_keys: Vec<String>,
}

impl ObjectChanges {
    /// Compares two object lists sorted by key.
    pub fn between(old: &[ObjectVersion], new: &[ObjectVersion]) -> Self {
        let mut c = ObjectChanges::default();
        let note = |n: &mut u64, keys: &mut Vec<String>, key: &str| {
            *n += 1;
            if keys.len() < CHANGES_LISTED {
                keys.push(key.to_owned());
            }
        };
        let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => return c,
                (Some(o), None) => {
                    note(&mut c.removed, &mut c.removed_keys, &o.key);
                    a.next();
                }
                (None, Some(n)) => {
                    note(&mut c.added, &mut c.added_keys, &n.key);
                    b.next();
                }
                (Some(o), Some(n)) => match o.key.cmp(&n.key) {
                    std::cmp::Ordering::Less => {
                        note(&mut c.removed, &mut c.removed_keys, &o.key);
                        a.next();
                    }
                    std::cmp::Ordering::Greater => {
                        note(&mut c.added, &mut c.added_keys, &n.key);
                        b.next();
                    }
                    std::cmp::Ordering::Equal => {
                        if o.size != n.size || o.etag != n.etag {
                            note(&mut c.changed, &mut c.changed_keys, &n.key);
                        } else {
                            c.unchanged += 1;
                        }
                        a.next();
                        b.next();
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reindex_compares_keys_sizes_and_etags() {
        let v = |key: &str, size: u64, etag: Option<&str>| ObjectVersion {
            key: key.into(),
            size,
            etag: etag.map(Into::into),
        };
        let old = [
            v("a", 1, Some("1")),
            v("b", 2, Some("2")),
            v("c", 3, None),
            v("d", 4, Some("4")),
        ];
        let new = [
            v("a", 1, Some("1")),
            v("b", 2, Some("2b")),
            v("d", 5, Some("4")),
            v("e", 6, None),
        ];
        let c = ObjectChanges::between(&old, &new);
        assert_eq!((c.added, c.removed, c.changed, c.unchanged), (1, 1, 2, 1));
        assert_eq!(c.added_keys, ["e"]);
        assert_eq!(c.removed_keys, ["c"]);
        assert_eq!(c.changed_keys, ["b", "d"]);
        let bytes = ObjectVersion::encode_all(&new);
        assert_eq!(ObjectVersion::decode_all(&bytes).unwrap(), new);
        // Many added: all counted, the first CHANGES_LISTED named.
        let many: Vec<_> = (0..250).map(|i| v(&format!("k{i:03}"), 1, None)).collect();
        let c = ObjectChanges::between(&[], &many);
        assert_eq!(c.added, 250);
        assert_eq!(c.added_keys.len(), CHANGES_LISTED);
        assert_eq!(c.added_keys[0], "k000");
    }
}
