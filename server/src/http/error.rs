//! Errors as HTTP responses: the one table from an error code to its HTTP status, and the
//! body every error has, `{"error": {"code": "...", "message": "..."}}`.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde_json::json;

use crate::error::{Code, Error};

/// The HTTP status of each error code.
pub fn status(code: Code) -> StatusCode {
    match code {
        Code::InvalidRequest | Code::EmptySubset => StatusCode::BAD_REQUEST,
        Code::Unauthorized => StatusCode::UNAUTHORIZED,
        Code::PathNotAllowed => StatusCode::FORBIDDEN,
        Code::DatasetNotFound | Code::JobNotFound | Code::NotFound => StatusCode::NOT_FOUND,
        Code::DatasetExists
        | Code::JobExists
        | Code::DatasetInUse
        | Code::DatasetNotReady
        | Code::VersionMismatch => StatusCode::CONFLICT,
        Code::TooLarge => StatusCode::UNPROCESSABLE_ENTITY,
        Code::CacheFull | Code::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ResponseError for Error {
    fn status_code(&self) -> StatusCode {
        status(self.code)
    }
    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code())
            .json(json!({"error": {"code": self.code.as_str(), "message": self.message}}))
    }
}

/// Anything without a route: the same error model.
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    Error::new(
        Code::NotFound,
        format!("no route for {} {}", req.method(), req.path()),
    )
    .error_response()
}
