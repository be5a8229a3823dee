//! The web dashboard (`web-ui/`), embedded in the binary, at `/` and `/ui/{file}`.

use actix_web::{HttpResponse, ResponseError, get, web};
use utoipa_actix_web::service_config::ServiceConfig;

use super::error::errors;
use crate::error::{Code, Error};

errors!(FileErrors: NotFound);

/// The dashboard's files (`web-ui/`), embedded in the binary.
const DASHBOARD: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../../../web-ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../../web-ui/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../../../web-ui/style.css"),
    ),
    // The charts: uPlot 1.6.32 (MIT), vendored from npm's `uplot` package `dist/`; its license
    // ships with it.
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../../web-ui/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../../../web-ui/uPlot.min.css"),
    ),
    (
        "uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../../../../web-ui/uPlot.LICENSE"),
    ),
];

fn dashboard_file(name: &str) -> HttpResponse {
    match DASHBOARD.iter().find(|(n, _, _)| *n == name) {
        Some((_, mime, body)) => HttpResponse::Ok()
            .content_type(*mime)
            .insert_header(("cache-control", "no-cache"))
            .body(*body),
        None => Error::new(Code::NotFound, format!("no dashboard file '{name}'")).error_response(),
    }
}

/// The dashboard (add `?token=...` when the server requires a bearer token).
#[utoipa::path(
    tag = "dashboard",
    responses((status = 200, description = "the dashboard's page", body = String,
        content_type = "text/html; charset=utf-8"))
)]
#[get("/")]
async fn dashboard() -> HttpResponse {
    dashboard_file("index.html")
}

/// A file of the dashboard.
#[utoipa::path(
    tag = "dashboard",
    params(("file" = String, Path, description = "`index.html`, `app.js`, `style.css`, …",
        example = "app.js")),
    responses(
        (status = 200, description = "the file, with the content type of its kind"),
        FileErrors
    )
)]
#[get("/ui/{file}")]
async fn dashboard_asset(file: web::Path<String>) -> HttpResponse {
    dashboard_file(&file)
}

pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(dashboard).service(dashboard_asset);
}
