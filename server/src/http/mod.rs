//! The HTTP layer: routes per resource over the registry (`crate::registry`), the JSON views
//! responses carry, and the one mapping from error codes to HTTP statuses (`error`). Handlers
//! parse, call the registry and render; blocking work (redb commits) goes to the blocking
//! pool, never onto an HTTP worker.

pub mod dashboard;
pub mod datasets;
pub mod error;
pub mod jobs;
pub mod stats;
pub mod views;

use actix_web::{HttpRequest, HttpResponse, get, web};

use crate::error::{Code, Error};
pub use error::not_found;

#[get("/v1/openapi.json")]
async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}

/// The OpenAPI document (kept in step with the routes by a test).
pub const OPENAPI: &str = include_str!("openapi.json");

/// Every route: (method, path) as written in the OpenAPI document.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/"),
    ("get", "/ui/{file}"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/stats"),
    ("get", "/v1/stats/history"),
    ("post", "/v1/datasets"),
    ("get", "/v1/datasets"),
    ("get", "/v1/datasets/{name}"),
    ("delete", "/v1/datasets/{name}"),
    ("get", "/v1/datasets/{name}/failures"),
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{name}"),
    ("delete", "/v1/jobs/{name}"),
];

/// Registers the routes and the JSON error handling.
pub fn configure(cfg: &mut web::ServiceConfig) {
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
    .service(openapi)
    .configure(dashboard::configure)
    .configure(stats::configure)
    .configure(datasets::configure)
    .configure(jobs::configure);
}
