//! Errors as HTTP responses and as documentation, both from the one table of codes
//! (`crate::error::Code`): the status of a response, the body every error has,
//! `{"error": {"code": "...", "message": "..."}}`, and the OpenAPI description of both (the
//! `ErrorCode` schema, and each route's error responses from the codes it can return).
//! Requests no route takes are answered by `super::unrouted`.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{RefOr, Response, ResponseBuilder};
use utoipa::{PartialSchema, ToSchema};

use crate::error::{Code, Error};

/// The HTTP status of each error code (from the table in `crate::error`).
pub fn status(code: Code) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: Code,
    /// What went wrong and what to do about it.
    pub message: String,
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl PartialSchema for Code {
    fn schema() -> RefOr<Schema> {
        let mut description = String::from("The error codes (code, HTTP status: meaning):\n");
        for c in Code::ALL {
            description.push_str(&format!(
                "\n- `{}` ({}): {}",
                c.as_str(),
                c.http_status(),
                c.meaning()
            ));
        }
        ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::String))
            .enum_values(Some(Code::ALL.iter().map(|c| c.as_str())))
            .description(Some(description))
            .into()
    }
}

impl ToSchema for Code {
    fn name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }
}

impl ResponseError for Error {
    fn status_code(&self) -> StatusCode {
        status(self.code)
    }
    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message.clone(),
            },
        })
    }
}

/// The error responses of a route that fails with `codes`: one per HTTP status, carrying the
/// error body and naming the codes with their meaning.
pub fn responses(codes: &[Code]) -> BTreeMap<String, RefOr<Response>> {
    let mut by_status: BTreeMap<u16, Vec<Code>> = BTreeMap::new();
    for &c in codes {
        by_status.entry(c.http_status()).or_default().push(c);
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let description = codes
                .iter()
                .map(|c| format!("`{}`: {}", c.as_str(), c.meaning()))
                .collect::<Vec<_>>()
                .join("; ");
            let response = ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    utoipa::openapi::ContentBuilder::new()
                        .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                            ErrorBody::name(),
                        ))))
                        .build(),
                )
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// Declares the error responses of a route as a type for `#[utoipa::path(responses(...))]`:
/// `errors!(CreateErrors: InvalidRequest, DatasetExists);`.
macro_rules! errors {
    ($(#[$doc:meta])* $name:ident: $($code:ident),+ $(,)?) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
            > {
                $crate::http::error::responses(&[$($crate::error::Code::$code),+])
            }
        }
    };
}
pub(crate) use errors;
