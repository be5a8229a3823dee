//! Jobs: what a registration asks for and its checks (`request`), the limits a job must fit
//! (`limits`), the name a registration reserves (`reserve`), registration itself, a new job
//! or another rank of a running one (`register`), and stopping (`stop`). A new job parameter
//! is a field of [`JobRequest`] (checked in [`JobRequest::validate`] when it can be checked
//! alone) and the one phase of [`register_job`] that uses it.

mod limits;
mod register;
mod request;
mod reserve;
mod stop;

pub use limits::{MAX_CLUSTER_WORLD_SIZE, MAX_RING_CAPACITY, MAX_WORLD_SIZE, min_element_bytes};
pub use register::register_job;
pub use request::{
    ClientInfo, JobRequest, Ranks, ReplaySpec, ResumeState, SAMPLER_NAMES, pipeline_or_default,
};
pub use stop::stop_job;
