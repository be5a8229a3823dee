//! The persistent catalog of datasets: an embedded redb database under the data directory.
//! It stores each dataset's definition and, once indexed, its index, so that a restarted
//! server serves the same datasets without indexing them again.
//!
//! An index is stored in its compact form (`DatasetIndex::write_to`: a versioned tag, then
//! the columns) in a file of its own under `indexes/` beside `catalog.redb`, written as it is
//! serialized (no copy of the whole in memory: for ImageNet's 1.28 M entries a 92 MB buffer,
//! and a 128 MiB page that redb would have filled and freed, memory that the allocator keeps
//! after indexing). The `indexes` table holds the file's name; the file is complete and synced
//! before the transaction that names it commits, and the file it replaced is removed after.
//! Files that no entry names (a crash between the two) are removed when the catalog opens.
//! An index that an older joader stored inside the table is still read; one stored in
//! another format is not: its dataset is indexed again at start-up (see
//! `registry::load_catalog`), as is one whose file has gone.
//!
//! An `s3` dataset also has its objects stored (key, size, ETag; `ObjectVersion::encode_all`),
//! which a re-index compares with the objects it finds.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use joader_storage::s3::{ObjectChanges, ObjectVersion};
use joader_storage::{DatasetIndex, IndexFormatError, SourceSpec};
use redb::{Builder, Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const DATASETS: TableDefinition<&str, &[u8]> = TableDefinition::new("datasets");
const INDEXES: TableDefinition<&str, &[u8]> = TableDefinition::new("indexes");
const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
/// A leader's journal (`cluster::leader::journal`): its generation, and its multi-node jobs
/// by id (JSON), written before the leader answers the request that changed them.
const CLUSTER: TableDefinition<&str, u64> = TableDefinition::new("cluster");
const CLUSTER_JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("cluster_jobs");

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
    /// The dataset's preload request (`registry::preload::PreloadRequest` as JSON), kept until
    /// released: a restarted server preloads it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preload: Option<serde_json::Value>,
    /// What was appended to the dataset since it was indexed, in order (`POST
    /// /v1/datasets/{name}/append`): a dataset indexed again from its source (a server that
    /// stopped while indexing it) indexes these after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub appended: Vec<Appended>,
}

/// One append to a dataset.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Appended {
    /// The paths it named.
    #[schema(value_type = Vec<String>)]
    pub paths: Vec<std::path::PathBuf>,
    /// Items it added.
    pub items: u64,
    pub appended_unix: u64,
}

/// The folder of the index files, beside `catalog.redb`.
const INDEX_DIR: &str = "indexes";
/// What the `indexes` table holds for an index in a file: this tag, then the file's name.
const IN_FILE: &[u8] = b"JOADER-INDEX-FILE:";

pub struct Catalog {
    db: Database,
    /// The folder of the index files.
    indexes: PathBuf,
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
        tx.open_table(CLUSTER)?;
        tx.open_table(CLUSTER_JOBS)?;
        tx.commit()?;
        let indexes = dir.join(INDEX_DIR);
        std::fs::create_dir_all(&indexes)
            .with_context(|| format!("cannot create {}", indexes.display()))?;
        let catalog = Self { db, indexes };
        catalog.remove_unnamed_files()?;
        Ok(catalog)
    }

    /// Removes the index files that no entry names: a put or a removal interrupted between
    /// its file and its transaction.
    fn remove_unnamed_files(&self) -> Result<()> {
        let named: std::collections::HashSet<String> = {
            let tx = self.db.begin_read()?;
            let t = tx.open_table(INDEXES)?;
            let mut named = std::collections::HashSet::new();
            for entry in t.iter()? {
                let (_, v) = entry?;
                named.extend(file_of(v.value()));
            }
            named
        };
        for entry in std::fs::read_dir(&self.indexes)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !named.contains(&name) {
                tracing::info!(file = %name, "removing an index file no dataset names");
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    /// Writes `index` into a new file under `indexes/` (synced, then renamed into place) and
    /// returns the file's name.
    fn write_index_file(&self, dataset: &str, index: &DatasetIndex) -> Result<String> {
        let stem: String = dataset
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_-.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let name = format!("{stem}.{nanos:x}.index");
        let tmp = self.indexes.join(format!("{name}.tmp"));
        let write = || -> std::io::Result<()> {
            let file = std::fs::File::create(&tmp)?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
            index.write_to(&mut w)?;
            w.flush()?;
            w.get_ref().sync_all()?;
            std::fs::rename(&tmp, self.indexes.join(&name))?;
            std::fs::File::open(&self.indexes)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            anyhow::Error::new(e).context(format!(
                "cannot write the index of dataset '{dataset}' into {}",
                self.indexes.display()
            ))
        })?;
        Ok(name)
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
        let file = match index {
            Some(index) => Some(self.write_index_file(&rec.name, index)?),
            None => None,
        };
        let mut replaced = None;
        let mut put = || -> Result<()> {
            let tx = self.db.begin_write()?;
            {
                let mut t = tx.open_table(DATASETS)?;
                t.insert(rec.name.as_str(), serde_json::to_vec(rec)?.as_slice())?;
                if let Some(file) = &file {
                    let mut i = tx.open_table(INDEXES)?;
                    let value = [IN_FILE, file.as_bytes()].concat();
                    replaced = i
                        .insert(rec.name.as_str(), value.as_slice())?
                        .and_then(|old| file_of(old.value()));
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
        };
        if let Err(e) = put() {
            if let Some(file) = &file {
                let _ = std::fs::remove_file(self.indexes.join(file));
            }
            return Err(e);
        }
        if let Some(old) = replaced {
            let _ = std::fs::remove_file(self.indexes.join(old));
        }
        Ok(())
    }

    pub fn remove(&self, name: &str) -> Result<()> {
        let tx = self.db.begin_write()?;
        let file = {
            tx.open_table(DATASETS)?.remove(name)?;
            let file = tx
                .open_table(INDEXES)?
                .remove(name)?
                .and_then(|v| file_of(v.value()));
            tx.open_table(OBJECTS)?.remove(name)?;
            file
        };
        tx.commit()?;
        if let Some(file) = file {
            let _ = std::fs::remove_file(self.indexes.join(file));
        }
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

    /// A leader's next generation: one more than the last one stored (1 for the first start),
    /// stored before it is returned, so that no two starts of a leader on this data directory
    /// take the same one.
    pub fn next_generation(&self) -> Result<u64> {
        let tx = self.db.begin_write()?;
        let next = {
            let mut t = tx.open_table(CLUSTER)?;
            let last = t.get("generation")?.map_or(0, |v| v.value());
            let next = last + 1;
            t.insert("generation", next)?;
            next
        };
        tx.commit()?;
        Ok(next)
    }

    /// Stores (or replaces) a leader's journal entry of multi-node job `id`.
    pub fn put_cluster_job(&self, id: u64, entry: &[u8]) -> Result<()> {
        let tx = self.db.begin_write()?;
        tx.open_table(CLUSTER_JOBS)?.insert(id, entry)?;
        tx.commit()?;
        Ok(())
    }

    /// Removes a leader's journal entry of multi-node job `id`.
    pub fn remove_cluster_job(&self, id: u64) -> Result<()> {
        let tx = self.db.begin_write()?;
        tx.open_table(CLUSTER_JOBS)?.remove(id)?;
        tx.commit()?;
        Ok(())
    }

    /// A leader's journal entries of multi-node jobs, by id.
    pub fn cluster_jobs(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(CLUSTER_JOBS)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            let (k, v) = entry?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// The stored index of a dataset: `None` if there is none, or if it was stored by an
    /// older joader in another format (then the dataset must be indexed again).
    pub fn index(&self, name: &str) -> Result<Option<DatasetIndex>> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(INDEXES)?;
        let Some(v) = t.get(name)? else {
            return Ok(None);
        };
        let stored = match file_of(v.value()) {
            Some(file) => {
                let path = self.indexes.join(&file);
                match std::fs::read(&path) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::warn!(dataset = %name, file = %path.display(), error = %e,
                            "the dataset's index file cannot be read: indexing it again");
                        return Ok(None);
                    }
                }
            }
            // Stored in the table by an older joader.
            None => v.value().to_vec(),
        };
        match DatasetIndex::from_bytes(&stored) {
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

/// The index file an `indexes` entry names, if it names one.
fn file_of(value: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(value.strip_prefix(IN_FILE)?).ok()?;
    // Only a plain name inside the folder.
    (!name.is_empty() && !name.contains('/') && !name.starts_with('.')).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with a two-entry manifest, its index and a ready dataset `d` of it.
    fn dataset() -> (tempfile::TempDir, DatasetIndex, DatasetRecord) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.jpg"), b"a").unwrap();
        std::fs::write(dir.path().join("m.csv"), "a.jpg,3\na.jpg,1\n").unwrap();
        let source = SourceSpec::Manifest {
            path: dir.path().join("m.csv"),
            format: None,
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
            preload: None,
            appended: Vec::new(),
        };
        (dir, index, rec)
    }

    #[test]
    fn indexes_round_trip_and_an_older_format_asks_for_indexing_again() {
        let (dir, index, rec) = dataset();
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

    fn files(data: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(data.join(INDEX_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_index_lives_in_one_file_that_follows_its_dataset() {
        let (dir, index, rec) = dataset();
        let data = dir.path().join("data");
        let catalog = Catalog::open(&data).unwrap();
        catalog.put(&rec, Some(&index)).unwrap();
        let first = files(&data);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(
            first[0].starts_with("d.") && first[0].ends_with(".index"),
            "{first:?}"
        );
        // The file holds the index's persisted form, byte for byte.
        assert_eq!(
            std::fs::read(data.join(INDEX_DIR).join(&first[0])).unwrap(),
            index.to_bytes()
        );
        // A record alone keeps the index; a new index replaces the file.
        catalog.put(&rec, None).unwrap();
        assert_eq!(files(&data), first);
        catalog.put(&rec, Some(&index)).unwrap();
        let second = files(&data);
        assert_eq!(second.len(), 1);
        assert_ne!(second, first);
        assert_eq!(catalog.index("d").unwrap(), Some(index.clone()));
        // Removing the dataset removes its file.
        catalog.remove("d").unwrap();
        assert!(files(&data).is_empty());
        // A file no entry names (a crash before its transaction) is removed at open; an
        // entry whose file has gone means indexing again.
        catalog.put(&rec, Some(&index)).unwrap();
        let kept = files(&data);
        std::fs::write(data.join(INDEX_DIR).join("d.1.index.tmp"), b"half").unwrap();
        std::fs::write(data.join(INDEX_DIR).join("e.2.index"), index.to_bytes()).unwrap();
        drop(catalog);
        let catalog = Catalog::open(&data).unwrap();
        assert_eq!(files(&data), kept);
        assert_eq!(catalog.index("d").unwrap(), Some(index.clone()));
        std::fs::remove_file(data.join(INDEX_DIR).join(&kept[0])).unwrap();
        assert_eq!(catalog.index("d").unwrap(), None);
        // An index that an earlier joader stored inside the table is still read.
        {
            let tx = catalog.db.begin_write().unwrap();
            tx.open_table(INDEXES)
                .unwrap()
                .insert("d", index.to_bytes().as_slice())
                .unwrap();
            tx.commit().unwrap();
        }
        assert_eq!(catalog.index("d").unwrap(), Some(index));
    }
}
