//! The web dashboard (`web-ui/`), embedded in the binary, at `/` and `/ui/{file}`.

use actix_web::{HttpResponse, ResponseError, get, web};

use crate::error::{Code, Error};

/// The dashboard's files (`web-ui/`), embedded in the binary.
const DASHBOARD: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../../web-ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web-ui/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../../web-ui/style.css"),
    ),
    // The charts: uPlot 1.6.32 (MIT), vendored from npm's `uplot` package `dist/`; its license
    // ships with it.
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web-ui/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../../web-ui/uPlot.min.css"),
    ),
    (
        "uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../../../web-ui/uPlot.LICENSE"),
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

#[get("/")]
async fn dashboard() -> HttpResponse {
    dashboard_file("index.html")
}

#[get("/ui/{file}")]
async fn dashboard_asset(file: web::Path<String>) -> HttpResponse {
    dashboard_file(&file)
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(dashboard).service(dashboard_asset);
}
