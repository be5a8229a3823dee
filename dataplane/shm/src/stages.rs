//! The client prefetch's stages of per-stage CPU accounting (the mechanism, [`Stage`],
//! [`enter`], [`StageSink`], is `joader-stages`', re-exported here for the clients).

pub use joader_stages::*;

/// The client prefetch's stages.
pub mod client {
    use super::Stage;
    /// Waiting for records on the ring (no CPU unless the wait spins).
    pub static WAIT: Stage = Stage::new("wait");
    /// Copying images out of their slots unchanged.
    pub static COPY: Stage = Stage::new("copy");
    /// Random resized crop (reads the slot, resizes).
    pub static CROP_RESIZE: Stage = Stage::new("crop_resize");
    /// Mirroring a `uint8` image (a float32 one is mirrored inside `normalize`).
    pub static FLIP: Stage = Stage::new("flip");
    /// Bytes to normalized float32 CHW (mirrored there when flipped).
    pub static NORMALIZE: Stage = Stage::new("normalize");
    /// Assembling a batch around the images: shapes, labels, ids, acknowledgements, padding,
    /// the augmentation threads' start and end.
    pub static COLLATE: Stage = Stage::new("collate");
    /// Handing a prepared batch to the consumer and taking buffers back.
    pub static HANDOVER: Stage = Stage::new("handover");
}

/// The client prefetch's stages.
pub static CLIENT: [&Stage; 7] = [
    &client::WAIT,
    &client::COPY,
    &client::CROP_RESIZE,
    &client::FLIP,
    &client::NORMALIZE,
    &client::COLLATE,
    &client::HANDOVER,
];

#[cfg(test)]
mod tests {
    use super::CLIENT;

    #[test]
    fn the_client_list_names_each_stage_once() {
        let mut names: Vec<&str> = CLIENT.iter().map(|s| s.name()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
