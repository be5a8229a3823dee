//! Class labels as sources store them, numbers or names: [`ClassTexts`] numbers each label
//! text as it is met, then [`ClassTexts::finish`] gives the final labels and class names.

use std::collections::HashMap;

use crate::index::NO_CLASS;
use crate::{StorageError, numeric_classes, numeric_label};

/// The label texts met while indexing, each numbered (provisionally) in order of appearance.
#[derive(Default)]
pub(crate) struct ClassTexts {
    ids: HashMap<Box<str>, u32>,
}

impl ClassTexts {
    /// The provisional number of label text `text`.
    pub(crate) fn id(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
        self.ids.insert(text.into(), id);
        id
    }

    /// Whether no text was met.
    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Turns the provisional `labels` (`NO_CLASS` left as it is) into the final ones and gives
    /// the class names. When every
    /// text is an integer (and `numbers` allows it), the labels are those numbers (`-1`:
    /// unlabelled) and the names `"0"..="max"`; else the classes are the texts, sorted, each
    /// label its text's place among them.
    pub(crate) fn finish(
        self,
        labels: &mut [u32],
        numbers: bool,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<String>, StorageError> {
        let mut texts: Vec<(Box<str>, u32)> = self.ids.into_iter().collect();
        texts.sort_by_key(|(_, id)| *id);
        let parsed: Option<Vec<i64>> = texts.iter().map(|(t, _)| t.trim().parse().ok()).collect();
        match parsed {
            Some(parsed) if numbers => {
                let map = parsed
                    .into_iter()
                    .map(|n| numeric_label(n, what))
                    .collect::<Result<Vec<u32>, _>>()?;
                if !map.is_empty() {
                    for l in labels.iter_mut().filter(|l| **l != NO_CLASS) {
                        *l = map[*l as usize];
                    }
                }
                Ok(numeric_classes(labels))
            }
            _ => {
                let mut order: Vec<usize> = (0..texts.len()).collect();
                order.sort_by(|&a, &b| texts[a].0.cmp(&texts[b].0));
                let mut map = vec![0u32; texts.len()];
                for (place, &id) in order.iter().enumerate() {
                    map[id] = u32::try_from(place).unwrap_or(u32::MAX);
                }
                for l in labels.iter_mut().filter(|l| **l != NO_CLASS) {
                    *l = map[*l as usize];
                }
                Ok(order
                    .into_iter()
                    .map(|id| texts[id].0.to_string())
                    .collect())
            }
        }
    }
}
