//! `/v1/nodes`: the leader's registry of nodes, and what the nodes' agents call (register,
//! heartbeat, forward their ranks of a multi-node job, and their streams: placements one way,
//! credit the other).

use actix_web::{HttpRequest, HttpResponse, get, post, web};
use utoipa_actix_web::service_config::ServiceConfig;

use super::error::errors;
use crate::cluster::{
    Heartbeat, HeartbeatReply, NodeJob, NodeJobAccepted, NodeList, NodeRegistered,
    NodeRegistration, ResumeReply, ResumeReport, node,
};
use crate::error::{Code, Error, Result};
use crate::state::AppState;

errors!(ListErrors: NotALeader);
errors!(RegisterErrors: InvalidRequest, NotALeader);
errors!(NodeErrors: InvalidRequest, NodeNotFound, NotALeader);
errors!(StreamErrors: InvalidRequest, NodeNotFound, NotALeader, ShuttingDown, StaleGeneration);
errors!(ResumeErrors: InvalidRequest, NodeNotFound, NotALeader, StaleGeneration, DatasetNotReady);
errors!(JoinErrors: InvalidRequest, EmptySubset, DatasetNotFound, NodeNotFound, JobExists,
    DatasetNotReady, NotALeader, NodeMismatch);

/// The nodes of the cluster (on the leader): address, state, last heartbeat, jobs, cache use
/// and the datasets as each node indexed them.
#[utoipa::path(
    tag = "cluster",
    responses((status = 200, description = "the nodes", body = NodeList), ListErrors)
)]
#[get("/v1/nodes")]
async fn list_nodes(state: web::Data<AppState>) -> Result<HttpResponse> {
    let l = state.leader_role()?;
    Ok(HttpResponse::Ok().json(NodeList {
        role: "leader".into(),
        leader: state.leader_url.clone(),
        generation: l.generation(),
        nodes: l.nodes()?,
        jobs: l.jobs()?,
    }))
}

/// A node registers with the leader (again after a restart: its old jobs fail).
#[utoipa::path(
    tag = "cluster",
    request_body = NodeRegistration,
    responses((status = 200, description = "registered", body = NodeRegistered), RegisterErrors)
)]
#[post("/v1/nodes")]
async fn register_node(
    state: web::Data<AppState>,
    body: web::Json<NodeRegistration>,
) -> Result<HttpResponse> {
    let r = state.leader_role()?.register(body.into_inner())?;
    Ok(HttpResponse::Ok().json(r))
}

/// A node's heartbeat, with its cache use and datasets; answers the leader's datasets.
#[utoipa::path(
    tag = "cluster",
    request_body = Heartbeat,
    params(("name" = String, Path, description = "the node's name", example = "node-a")),
    responses((status = 200, description = "the leader's datasets", body = HeartbeatReply), NodeErrors)
)]
#[post("/v1/nodes/{name}/heartbeat")]
async fn heartbeat(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<Heartbeat>,
) -> Result<HttpResponse> {
    let r = state
        .leader_role()?
        .heartbeat(&state.registry, &name, body.into_inner())?;
    Ok(HttpResponse::Ok().json(r))
}

/// A node's ranks of a multi-node job; the leader samples the job once every rank joined.
#[utoipa::path(
    tag = "cluster",
    request_body = NodeJob,
    params(("name" = String, Path, description = "the node's name", example = "node-a")),
    responses((status = 200, description = "joined", body = NodeJobAccepted), JoinErrors)
)]
#[post("/v1/nodes/{name}/jobs")]
async fn join_job(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<NodeJob>,
) -> Result<HttpResponse> {
    let l = state.leader_role()?.clone();
    let r = l.join(&state.registry, &name, body.into_inner()).await?;
    Ok(HttpResponse::Ok().json(r))
}

/// A node that lost its leader reports its multi-node jobs to the restarted leader (a new
/// generation), which answers those it cannot resume; the others resume once every node of
/// theirs has reported.
#[utoipa::path(
    tag = "cluster",
    request_body = ResumeReport,
    params(("name" = String, Path, description = "the node's name", example = "node-a")),
    responses((status = 200, description = "the jobs that cannot resume", body = ResumeReply), ResumeErrors)
)]
#[post("/v1/nodes/{name}/resume")]
async fn resume(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<ResumeReport>,
) -> Result<HttpResponse> {
    let l = state.leader_role()?.clone();
    let r = l.resume(&state.registry, &name, body.into_inner()).await?;
    Ok(HttpResponse::Ok().json(r))
}

/// The generation a node opens its stream for.
#[derive(serde::Deserialize, utoipa::IntoParams)]
struct StreamQuery {
    /// The leader generation the node registered with: another one is refused
    /// (`stale_generation`).
    generation: Option<u64>,
}

/// A node's stream, a WebSocket it keeps open while it has multi-node jobs: the leader writes
/// the node's placements as its Samplers' passes make them (JSON text frames, `Placements`;
/// a ping after a heartbeat with nothing to send), the node writes the credit its readers
/// returned and the jobs that failed there (`CreditReport`). When the stream ends or breaks,
/// both sides fail the node's multi-node jobs.
#[utoipa::path(
    tag = "cluster",
    params(("name" = String, Path, description = "the node's name", example = "node-a"), StreamQuery),
    responses(
        (status = 101, description = "switching to the WebSocket: frames are `Placements` from the leader and `CreditReport` from the node"),
        StreamErrors
    )
)]
#[get("/v1/nodes/{name}/stream")]
async fn stream(
    state: web::Data<AppState>,
    name: web::Path<String>,
    query: web::Query<StreamQuery>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse> {
    let l = state.leader_role()?.clone();
    crate::registry::check_not_draining(&state.registry)?;
    l.check_node(&name, query.generation)?;
    let (response, session, frames) = actix_ws::handle(&req, body).map_err(|e| {
        Error::new(
            Code::InvalidRequest,
            format!("a node stream is a WebSocket: {e}"),
        )
    })?;
    let (id, notify) = l.open_stream(&name)?;
    actix_web::rt::spawn(l.serve_stream(
        state.registry.clone(),
        name.into_inner(),
        id,
        notify,
        session,
        frames.max_frame_size(node::MAX_FRAME),
    ));
    Ok(response)
}

pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(list_nodes)
        .service(register_node)
        .service(heartbeat)
        .service(join_job)
        .service(resume)
        .service(stream);
}
