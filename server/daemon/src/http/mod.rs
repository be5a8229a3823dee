//! The HTTP layer: routes per resource over the registry (`crate::registry`), the JSON views
//! responses carry, and errors as responses (`error`). Handlers parse, call the registry and
//! render; blocking work (redb commits) goes to the blocking pool, never onto an HTTP worker.
//!
//! The OpenAPI document is generated, never written: every route is registered through
//! `utoipa_actix_web`'s `ServiceConfig`, whose `service` takes only handlers that carry a
//! `#[utoipa::path]`, so registering a route is documenting it. [`openapi`] builds the
//! document from [`configure`], the same function that registers the routes of the server.

pub mod auth;
pub mod cluster;
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
fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
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

/// The document, generated once per process.
fn document() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(openapi)
}

/// The methods the document gives `path` (a request's path, matched against the document's
/// templates: a `{param}` takes one non-empty segment), or `None` if no template matches.
pub fn documented_methods(path: &str) -> Option<Vec<&'static str>> {
    let matches = |template: &str| {
        let (mut t, mut p) = (template.split('/'), path.split('/'));
        loop {
            match (t.next(), p.next()) {
                (None, None) => return true,
                (Some(ts), Some(ps)) if ts.starts_with('{') && !ps.is_empty() => {}
                (Some(ts), Some(ps)) if ts == ps => {}
                _ => return false,
            }
        }
    };
    let (_, item) = document().paths.paths.iter().find(|(t, _)| matches(t))?;
    let methods = [
        ("GET", &item.get),
        ("PUT", &item.put),
        ("POST", &item.post),
        ("DELETE", &item.delete),
        ("OPTIONS", &item.options),
        ("HEAD", &item.head),
        ("PATCH", &item.patch),
        ("TRACE", &item.trace),
    ];
    Some(
        methods
            .into_iter()
            .filter(|(_, op)| op.is_some())
            .map(|(m, _)| m)
            .collect(),
    )
}

/// Requests no route takes: a documented path with another method is a 405 naming the
/// methods it has (the routes' method guards send those here too), anything else a 404.
pub async fn unrouted(req: HttpRequest) -> HttpResponse {
    use actix_web::ResponseError;
    let what = format!("{} {}", req.method(), req.path());
    match documented_methods(req.path()) {
        // (A documented method that reached here is a path its route's pattern refuses.)
        Some(methods) if !methods.contains(&req.method().as_str()) => {
            let allow = methods.join(", ");
            let mut response = Error::new(
                Code::MethodNotAllowed,
                format!("no route for {what}: {} takes {allow}", req.path()),
            )
            .error_response();
            if let Ok(value) = actix_web::http::header::HeaderValue::from_str(&allow) {
                response
                    .headers_mut()
                    .insert(actix_web::http::header::ALLOW, value);
            }
            response
        }
        _ => Error::new(Code::NotFound, format!("no route for {what}")).error_response(),
    }
}

/// This document (OpenAPI 3.1), generated from the handlers and their types.
#[utoipa::path(
    tag = "service",
    responses((status = 200, description = "the OpenAPI document", body = Object))
)]
#[get("/v1/openapi.json")]
async fn openapi_json() -> HttpResponse {
    static JSON: OnceLock<String> = OnceLock::new();
    let doc = JSON.get_or_init(|| {
        document()
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
    // The nodes' routes first: the leader answers hundreds of their requests a second, and
    // routing (twice with the metrics' `match_pattern`) tries the routes in this order.
    .configure(cluster::configure)
    .service(openapi_json)
    .configure(dashboard::configure)
    .configure(stats::configure)
    .configure(datasets::configure)
    .configure(jobs::configure);
}

#[cfg(test)]
mod tests;
