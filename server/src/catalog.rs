//! The persistent catalog of datasets: an embedded redb database under the data directory.
//! It stores each dataset's definition and, once indexed, its index, so that a restarted
//! server serves the same datasets without indexing them again.
//!
//! An index is stored in its compact form (`DatasetIndex::to_bytes`: a versioned tag, then
//! the columns). An index stored by an older joader in another format is not read: its
//! dataset is indexed again at start-up (see `registry::load_catalog`).
//!
//! An `s3` dataset also has its objects stored (key, size, ETag; `ObjectVersion::encode_all`),
//! which a re-index compares with the objects it finds.

use std::path::Path;

use anyhow::{Context, Result};
use joader_storage::s3::{ObjectChanges, ObjectVersion};
use joader_storage::{DatasetIndex, IndexFormatError, SourceSpec};
use redb::{Builder, Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const DATASETS: TableDefinition<&str, &[u8]> = TableDefinition::new("datasets");
const INDEXES: TableDefinition<&str, &[u8]> = TableDefinition::new("indexes");
const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");

/// redb's page cache. The catalog is written once per dataset and read at start-up, so
/// pages need not stay in memory (redb's default, 1 GiB, would keep a copy of every index
/// just written).
const CACHE_BYTES: usize = 8 << 20;

/// A dataset's definition and state as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DatasetRecord {
    pub name: String,
    pub source: SourceSpec,
    /// `indexing`, `ready` or `failed`.
    pub state: String,
    pub error: Option<String>,
    pub created_unix: u64,
    /// What the last re-index found changed in the store (`s3` sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<ObjectChanges>,
}

pub struct Catalog {
    db: Database,
}

impl Catalog {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
        let path = dir.join("catalog.redb");
        let db = Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .with_context(|| format!("cannot open the catalog {}", path.display()))?;
        let tx = db.begin_write()?;
        tx.open_table(DATASETS)?;
        tx.open_table(INDEXES)?;
        tx.open_table(OBJECTS)?;
        tx.commit()?;
        Ok(Self { db })
    }

    pub fn put(&self, rec: &DatasetRecord, index: Option<&DatasetIndex>) -> Result<()> {
        self.put_indexed(rec, index, None)
    }

    /// [`Catalog::put`], with the objects an `s3` index was made of, in one transaction.
    pub fn put_indexed(
        &self,
        rec: &DatasetRecord,
        index: Option<&DatasetIndex>,
        objects: Option<&[ObjectVersion]>,
    ) -> Result<()> {
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(DATASETS)?;
            t.insert(rec.name.as_str(), serde_json::to_vec(rec)?.as_slice())?;
            if let Some(index) = index {
                let mut i = tx.open_table(INDEXES)?;
                i.insert(rec.name.as_str(), index.to_bytes().as_slice())?;
            }
            if let Some(objects) = objects {
                let mut o = tx.open_table(OBJECTS)?;
                o.insert(
                    rec.name.as_str(),
                    ObjectVersion::encode_all(objects).as_slice(),
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn remove(&self, name: &str) -> Result<()> {
        let tx = self.db.begin_write()?;
        {
            tx.open_table(DATASETS)?.remove(name)?;
            tx.open_table(INDEXES)?.remove(name)?;
            tx.open_table(OBJECTS)?.remove(name)?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn records(&self) -> Result<Vec<DatasetRecord>> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(DATASETS)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            let (_, v) = entry?;
            out.push(serde_json::from_slice(v.value()).context("a corrupt catalog record")?);
        }
        Ok(out)
    }

    /// The objects the stored index of an `s3` dataset was made of (`None`: none stored, or
    /// unreadable, and then a re-index reports no changes).
    pub fn objects(&self, name: &str) -> Result<Option<Vec<ObjectVersion>>> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(OBJECTS)?;
        let Some(v) = t.get(name)? else {
            return Ok(None);
        };
        Ok(ObjectVersion::decode_all(v.value())
            .inspect_err(
                |e| tracing::warn!(dataset = %name, error = %e, "unreadable stored objects"),
            )
            .ok())
    }

    /// The stored index of a dataset: `None` if there is none, or if it was stored by an
    /// older joader in another format (then the dataset must be indexed again).
    pub fn index(&self, name: &str) -> Result<Option<DatasetIndex>> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(INDEXES)?;
        let Some(v) = t.get(name)? else {
            return Ok(None);
        };
        match DatasetIndex::from_bytes(v.value()) {
            Ok(index) => Ok(Some(index)),
            Err(e @ IndexFormatError::OtherVersion) => {
                tracing::warn!(dataset = %name, "{e}");
                Ok(None)
            }
            Err(e) => Err(e).with_context(|| {
                format!(
                    "the catalog's index of dataset '{name}' is damaged: move the data \
                     directory's catalog.redb away and create the datasets again"
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_round_trip_and_an_older_format_asks_for_indexing_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.jpg"), b"a").unwrap();
        std::fs::write(dir.path().join("m.csv"), "a.jpg,3\na.jpg,1\n").unwrap();
        let source = SourceSpec::Manifest {
            path: dir.path().join("m.csv"),
            fields: None,
        };
        let index = joader_storage::index(&source, &[dir.path().to_owned()], &mut |_| {}).unwrap();
        let rec = DatasetRecord {
            name: "d".into(),
            source,
            state: "ready".into(),
            error: None,
            created_unix: 1,
            changes: None,
        };
        let data = dir.path().join("data");
        {
            let catalog = Catalog::open(&data).unwrap();
            catalog.put(&rec, Some(&index)).unwrap();
            assert_eq!(catalog.index("d").unwrap(), Some(index.clone()));
            assert_eq!(catalog.records().unwrap(), std::slice::from_ref(&rec));
            assert_eq!(catalog.objects("d").unwrap(), None);
            let objects = [ObjectVersion {
                key: "a/b.jpg".into(),
                size: 3,
                etag: Some("\"e1\"".into()),
            }];
            catalog.put_indexed(&rec, None, Some(&objects)).unwrap();
            assert_eq!(catalog.objects("d").unwrap().as_deref(), Some(&objects[..]));
            catalog.remove("d").unwrap();
            assert_eq!(catalog.objects("d").unwrap(), None);
            catalog.put(&rec, Some(&index)).unwrap();
        }
        // An index as joader stored it before the columnar format (JSON of items): the
        // catalog still opens, and the dataset has no index (it is indexed again).
        {
            let db = Database::create(data.join("catalog.redb")).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(INDEXES)
                .unwrap()
                .insert(
                    "d",
                    br#"{"items":[{"location":{"File":"/x/a.jpg"},"label":3}],"classes":["0","1","2","3"],"shards":[]}"#
                        .as_slice(),
                )
                .unwrap();
            tx.commit().unwrap();
        }
        let catalog = Catalog::open(&data).unwrap();
        assert_eq!(catalog.index("d").unwrap(), None);
        assert_eq!(catalog.records().unwrap(), [rec]);
    }
}
