//! The bearer token (`--token`): a request to a route that [`super::requires_token`] without
//! `Authorization: Bearer <token>` is answered `401 unauthorized` before any handler runs.

use std::future::Future;

use actix_web::Error;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};

use crate::error::{self, Code};

/// The server's token, if it has one (none: every route is open).
#[derive(Clone, Default)]
pub struct BearerToken {
    expected: Option<String>,
}

impl BearerToken {
    pub fn new(token: Option<&str>) -> Self {
        Self {
            expected: token.map(|t| format!("Bearer {t}")),
        }
    }

    /// Whether a request to `path` with this `Authorization` header is refused.
    fn denies(&self, path: &str, authorization: Option<&str>) -> bool {
        self.expected
            .as_deref()
            .is_some_and(|want| super::requires_token(path) && authorization != Some(want))
    }

    /// The middleware (`App::wrap_fn`): passes the request on, or refuses it.
    pub fn check<S, B>(
        &self,
        req: ServiceRequest,
        srv: &S,
    ) -> impl Future<Output = Result<ServiceResponse<B>, Error>> + 'static + use<S, B>
    where
        S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
        S::Future: 'static,
    {
        let authorization = req
            .headers()
            .get("authorization")
            .and_then(|h| h.to_str().ok());
        let fut = (!self.denies(req.path(), authorization)).then(|| srv.call(req));
        async move {
            match fut {
                Some(f) => f.await,
                None => Err(error::Error::new(
                    Code::Unauthorized,
                    "a valid bearer token is required",
                )
                .into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BearerToken;

    #[test]
    fn only_the_token_routes_need_the_exact_token() {
        let open = BearerToken::new(None);
        assert!(!open.denies("/v1/jobs", None));
        let t = BearerToken::new(Some("s3cret"));
        assert!(t.denies("/v1/jobs", None));
        assert!(t.denies("/metrics", Some("Bearer other")));
        assert!(t.denies("/v1/datasets", Some("s3cret")));
        assert!(!t.denies("/v1/jobs", Some("Bearer s3cret")));
        assert!(!t.denies("/", None));
        assert!(!t.denies("/health", None));
    }
}
