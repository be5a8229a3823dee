//! The persistent catalog of datasets: an embedded redb database under the data directory.
//! It stores each dataset's definition and, once indexed, its index, so that a restarted
//! server serves the same datasets without indexing them again.

use std::path::Path;

use actors::storage::{DatasetIndex, SourceSpec};
use anyhow::{Context, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const DATASETS: TableDefinition<&str, &[u8]> = TableDefinition::new("datasets");
const INDEXES: TableDefinition<&str, &[u8]> = TableDefinition::new("indexes");

/// A dataset's definition and state as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DatasetRecord {
    pub name: String,
    pub source: SourceSpec,
    /// `indexing`, `ready` or `failed`.
    pub state: String,
    pub error: Option<String>,
    pub created_unix: u64,
}

pub struct Catalog {
    db: Database,
}

impl Catalog {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
        let path = dir.join("catalog.redb");
        let db = Database::create(&path)
            .with_context(|| format!("cannot open the catalog {}", path.display()))?;
        let tx = db.begin_write()?;
        tx.open_table(DATASETS)?;
        tx.open_table(INDEXES)?;
        tx.commit()?;
        Ok(Self { db })
    }

    pub fn put(&self, rec: &DatasetRecord, index: Option<&DatasetIndex>) -> Result<()> {
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(DATASETS)?;
            t.insert(rec.name.as_str(), serde_json::to_vec(rec)?.as_slice())?;
            if let Some(index) = index {
                let mut i = tx.open_table(INDEXES)?;
                i.insert(rec.name.as_str(), serde_json::to_vec(index)?.as_slice())?;
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

    pub fn index(&self, name: &str) -> Result<Option<DatasetIndex>> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(INDEXES)?;
        match t.get(name)? {
            Some(v) => Ok(Some(
                serde_json::from_slice(v.value()).context("a corrupt dataset index")?,
            )),
            None => Ok(None),
        }
    }
}
