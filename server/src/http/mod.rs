//! The HTTP layer: routes per resource over the registry (`crate::registry`), the JSON views
//! responses carry, and errors as responses (`error`). Handlers parse, call the registry and
//! render; blocking work (redb commits) goes to the blocking pool, never onto an HTTP worker.
//!
//! The OpenAPI document is generated, never written: every route is registered through
//! `utoipa_actix_web`'s `ServiceConfig`, whose `service` takes only handlers that carry a
//! `#[utoipa::path]`, so registering a route is documenting it. [`openapi`] builds the
//! document from [`configure`], the same function that registers the routes of the server.

pub mod dashboard;
pub mod datasets;
pub mod error;
pub mod jobs;
pub mod stats;
pub mod views;

use std::sync::OnceLock;

use actix_web::{App, HttpRequest, HttpResponse, get, web};
use utoipa::OpenApi;
use utoipa::openapi::path::Operation;
use utoipa_actix_web::AppExt;
use utoipa_actix_web::service_config::ServiceConfig;

use crate::error::{Code, Error};
pub use error::not_found;

/// What the document says beyond the routes: its title and the error body's schema.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "joader",
        description = "Prepare training data once, serve it to many jobs through shared memory. \
            Every error is `{\"error\": {\"code\", \"message\"}}`; the `ErrorCode` schema lists \
            the codes with their HTTP status and meaning."
    ),
    components(schemas(error::ErrorBody))
)]
struct ApiDoc;

/// The routes that require the bearer token when the server has one (`--token`); the
/// dashboard's page and files and the health check stay open.
pub fn requires_token(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/metrics"
}

/// The OpenAPI document of the routes [`configure`] registers, with the errors every route
/// may answer: `internal`, and `unauthorized` where [`requires_token`].
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .configure(configure)
        .split_for_parts();
    for (path, item) in doc.paths.paths.iter_mut() {
        let mut common = vec![Code::Internal];
        if requires_token(path) {
            common.push(Code::Unauthorized);
        }
        for op in operations(item) {
            for (status, response) in error::responses(&common) {
                op.responses.responses.entry(status).or_insert(response);
            }
        }
    }
    doc
}

/// The operations of a path, whatever their method.
pub fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// This document (OpenAPI 3.1), generated from the handlers and their types.
#[utoipa::path(
    tag = "service",
    responses((status = 200, description = "the OpenAPI document", body = Object))
)]
#[get("/v1/openapi.json")]
async fn openapi_json() -> HttpResponse {
    static DOC: OnceLock<String> = OnceLock::new();
    let doc = DOC.get_or_init(|| {
        openapi()
            .to_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot render the document: {e}\"}}"))
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(doc.as_str())
}

/// Registers the routes and the JSON error handling. Register routes here or in the
/// resources' `configure` only, through `ServiceConfig::service` (see the module's docs).
pub fn configure(cfg: &mut ServiceConfig) {
    cfg.app_data(web::JsonConfig::default().limit(64 << 20).error_handler(
        |err, _req: &HttpRequest| {
            Error::new(Code::InvalidRequest, format!("invalid JSON body: {err}")).into()
        },
    ))
    .app_data(
        web::QueryConfig::default().error_handler(|err, _req: &HttpRequest| {
            Error::new(Code::InvalidRequest, format!("invalid query: {err}")).into()
        }),
    )
    .app_data(
        web::PathConfig::default().error_handler(|err, _req: &HttpRequest| {
            Error::new(Code::InvalidRequest, format!("invalid path: {err}")).into()
        }),
    )
    .service(openapi_json)
    .configure(dashboard::configure)
    .configure(stats::configure)
    .configure(datasets::configure)
    .configure(jobs::configure);
}

#[cfg(test)]
mod tests;
