//! `/v1/nodes`: the leader's registry of nodes, and what the nodes' agents call (register,
//! heartbeat, forward their ranks of a multi-node job, return credit, fetch placements).

use actix_web::{HttpResponse, get, post, web};
use utoipa_actix_web::service_config::ServiceConfig;

use super::error::errors;
use crate::cluster::{
    CreditReport, Fetch, FetchReply, Heartbeat, HeartbeatReply, NodeJob, NodeJobAccepted, NodeList,
    NodeRegistered, NodeRegistration, leader,
};
use crate::error::Result;
use crate::registry::AppState;

errors!(ListErrors: NotALeader);
errors!(RegisterErrors: InvalidRequest, NotALeader);
errors!(NodeErrors: InvalidRequest, NodeNotFound, NotALeader);
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
    let nodes = leader::of(&state)?.nodes()?;
    Ok(HttpResponse::Ok().json(NodeList {
        role: "leader".into(),
        leader: state.leader_url.clone(),
        nodes,
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
    let r = leader::of(&state)?.register(body.into_inner())?;
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
    let r = leader::of(&state)?.heartbeat(&state, &name, body.into_inner())?;
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
    let l = leader::of(&state)?.clone();
    let r = l.join(&state, &name, body.into_inner()).await?;
    Ok(HttpResponse::Ok().json(r))
}

/// Credit a node's rings freed, and multi-node jobs that failed there.
#[utoipa::path(
    tag = "cluster",
    request_body = CreditReport,
    params(("name" = String, Path, description = "the node's name", example = "node-a")),
    responses((status = 200, description = "taken", body = Object), NodeErrors)
)]
#[post("/v1/nodes/{name}/credits")]
async fn credits(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<CreditReport>,
) -> Result<HttpResponse> {
    leader::of(&state)?.credits(&name, body.into_inner())?;
    Ok(HttpResponse::Ok().json(serde_json::json!({})))
}

/// The placements waiting for a node, in order (waits up to `wait_ms` when there are none).
#[utoipa::path(
    tag = "cluster",
    request_body = Fetch,
    params(("name" = String, Path, description = "the node's name", example = "node-a")),
    responses((status = 200, description = "the placements", body = FetchReply), NodeErrors)
)]
#[post("/v1/nodes/{name}/fetch")]
async fn fetch(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<Fetch>,
) -> Result<HttpResponse> {
    let l = leader::of(&state)?.clone();
    let r = l.fetch(&name, body.into_inner()).await?;
    Ok(HttpResponse::Ok().json(r))
}

pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(list_nodes)
        .service(register_node)
        .service(heartbeat)
        .service(join_job)
        .service(credits)
        .service(fetch);
}
