//! Plugs storage and the shared pipeline into the actors' seams.

use std::sync::Arc;

use actors::pipeline::{self, Limits, Output, Pipeline, PipelineError};
use actors::service::{ElementSource, LoadFailure, Prepare, Prepared};
use actors::storage::{DatasetIndex, StorageError};
use dataplane::element_error;

/// A dataset index read through storage.
pub struct IndexSource(pub Arc<DatasetIndex>);

impl ElementSource for IndexSource {
    fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
        self.0.read(element).map_err(|e: StorageError| LoadFailure {
            code: if e.code() == "not_found" {
                element_error::NOT_FOUND
            } else {
                element_error::IO
            },
            kind: e.code().to_string(),
            message: e.to_string(),
        })
    }

    fn label(&self, element: u32) -> i64 {
        self.0.label(element).unwrap_or(-1)
    }
}

/// A pipeline with its limits.
pub struct PipelinePrepare {
    pub pipeline: Pipeline,
    pub limits: Limits,
}

impl Prepare for PipelinePrepare {
    fn prepare(&self, bytes: &[u8]) -> Result<Prepared, LoadFailure> {
        match pipeline::run(&self.pipeline, bytes, &self.limits) {
            Ok(Output::Raw(bytes)) => Ok(Prepared {
                bytes,
                format: dataplane::Format::Raw,
            }),
            Ok(Output::Hwc {
                data,
                height,
                width,
                channels,
            }) => Ok(Prepared {
                bytes: data,
                format: dataplane::Format::HwcU8 {
                    height,
                    width,
                    channels,
                },
            }),
            Err(e) => Err(LoadFailure {
                code: match e {
                    PipelineError::TooLarge { .. } => element_error::TOO_LARGE,
                    _ => element_error::DECODE,
                },
                kind: e.code().to_string(),
                message: e.to_string(),
            }),
        }
    }

    fn decodes(&self) -> bool {
        !matches!(self.pipeline, Pipeline::Raw)
    }
}
