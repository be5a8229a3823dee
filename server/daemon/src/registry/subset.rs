//! A job's subset of its dataset, as the job asks for it and as ids.

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};

use crate::error::{Code, Error, Result};

/// Which elements of the dataset a job trains on. Either a list of ids, or an object whose
/// filters all apply: `{"start": a, "end": b}` (ids a..b), `"ranges": [[a, b], …]`,
/// `"classes": ["cat", …]`, `"ids": […]`, then `"fraction": f` with `"seed"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SubsetSpec {
    Ids(Vec<u32>),
    Filter(SubsetFilter),
}

/// Filters that all apply: ids `start..end`, `ranges` (`[a, b)` each), `classes` (names),
/// `ids`, then a `fraction` of what is left drawn with `seed`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubsetFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Vec<[u32; 2]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl SubsetSpec {
    /// The subset as ids of a dataset of `len` items with these labels and class names.
    pub fn resolve(
        &self,
        len: u32,
        labels: impl Fn(u32) -> i64,
        classes: &[String],
    ) -> Result<RoaringBitmap> {
        let bad = |m: String| Error::new(Code::InvalidRequest, m);
        let check_ids = |ids: &[u32]| -> Result<RoaringBitmap> {
            if let Some(&e) = ids.iter().find(|&&e| e >= len) {
                return Err(bad(format!(
                    "subset id {e} is beyond the dataset's {len} items"
                )));
            }
            Ok(ids.iter().copied().collect())
        };
        let f = match self {
            SubsetSpec::Ids(ids) => return check_ids(ids),
            SubsetSpec::Filter(f) => f,
        };
        let mut set = RoaringBitmap::new();
        set.insert_range(0..len);
        if f.start.is_some() || f.end.is_some() {
            let (a, b) = (f.start.unwrap_or(0), f.end.unwrap_or(len));
            if a > b || b > len {
                return Err(bad(format!("subset range {a}..{b} is not within 0..{len}")));
            }
            set &= (a..b).collect::<RoaringBitmap>();
        }
        if let Some(ranges) = &f.ranges {
            let mut r = RoaringBitmap::new();
            for &[a, b] in ranges {
                if a > b || b > len {
                    return Err(bad(format!("subset range {a}..{b} is not within 0..{len}")));
                }
                r.insert_range(a..b);
            }
            set &= r;
        }
        if let Some(names) = &f.classes {
            let mut wanted = Vec::new();
            for n in names {
                let i = classes
                    .iter()
                    .position(|c| c == n)
                    .ok_or_else(|| bad(format!("the dataset has no class '{n}'")))?;
                wanted.push(i as i64);
            }
            set = set
                .iter()
                .filter(|&e| wanted.contains(&labels(e)))
                .collect();
        }
        if let Some(ids) = &f.ids {
            set &= check_ids(ids)?;
        }
        if let Some(frac) = f.fraction {
            if !(frac > 0.0 && frac <= 1.0) {
                return Err(bad(format!(
                    "subset fraction must be in (0, 1], got {frac}"
                )));
            }
            let all: Vec<u32> = set.iter().collect();
            let k = ((all.len() as f64) * frac).round() as usize;
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(f.seed.unwrap_or(0));
            let mut picked: Vec<u32> = rand::seq::index::sample(&mut rng, all.len(), k)
                .into_iter()
                .map(|i| all[i])
                .collect();
            // Sorted, the ids fill the bitmap container by container.
            picked.sort_unstable();
            set = RoaringBitmap::from_sorted_iter(picked).map_err(Error::internal)?;
        }
        Ok(set)
    }
}

/// The ids `spec` selects of `index` (`None`: every item): a job's or a preload's subset.
pub fn ids_of(
    spec: Option<&SubsetSpec>,
    index: &joader_storage::DatasetIndex,
) -> Result<RoaringBitmap> {
    let len = index.len() as u32;
    match spec {
        None => {
            let mut all = RoaringBitmap::new();
            all.insert_range(0..len);
            Ok(all)
        }
        Some(s) => s.resolve(len, |e| index.label(e).unwrap_or(-1), index.classes()),
    }
}
