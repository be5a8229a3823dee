//! The allow-list ([`S3Allow`]): the `--allowed-s3` prefixes an `s3` source may read and the
//! endpoints the server may send its signed requests (and so its credentials) to.

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

use super::url::{S3Url, normalize_endpoint};
use crate::StorageError;

/// What `s3` sources may name: the `--allowed-s3` prefixes, and the endpoints the server may
/// send its signed requests to (its environment's `AWS_ENDPOINT_URL` and the
/// `--allowed-s3-endpoint` list). A request's `endpoint` receives the server's credentials,
/// so it is tied to the configuration like the buckets are.
#[derive(Clone, Debug, Default)]
pub struct S3Allow {
    prefixes: Vec<S3Url>,
    /// Normalized ([`normalize_endpoint`]).
    endpoints: Vec<String>,
}

impl S3Allow {
    /// `entries` (`s3://bucket[/prefix]`) and `endpoints` (urls), as configured.
    pub fn parse(entries: &[String], endpoints: &[String]) -> Result<Self, String> {
        Ok(S3Allow {
            prefixes: entries
                .iter()
                .map(|e| S3Url::parse(e))
                .collect::<Result<_, _>>()?,
            endpoints: endpoints
                .iter()
                .map(|e| normalize_endpoint(e))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Adds the endpoint of the server's environment (`AWS_ENDPOINT_URL`), where requests
    /// without an `endpoint` go anyway.
    pub fn with_environment(mut self) -> Self {
        let env = AmazonS3Builder::from_env().get_config_value(&AmazonS3ConfigKey::Endpoint);
        if let Some(e) = env.and_then(|e| normalize_endpoint(&e).ok()) {
            self.endpoints.push(e);
        }
        self
    }

    /// Whether `key` of `bucket` lies under an allowed prefix, taken as a folder
    /// (`s3://b/train` allows `train` and `train/...`, not `training/...`).
    pub fn permits(&self, bucket: &str, key: &str) -> bool {
        self.prefixes.iter().any(|a| {
            a.bucket == bucket
                && (a.key.is_empty()
                    || key == a.key.trim_end_matches('/')
                    || key.starts_with(&a.folder()))
        })
    }

    /// Refuses a url outside the list, naming the flag.
    pub fn check(&self, url: &S3Url) -> Result<(), StorageError> {
        if self.prefixes.is_empty() {
            return Err(StorageError::S3NotAllowed {
                url: url.to_string(),
                reason: "this server reads no object store: start it with --allowed-s3 \
                         s3://bucket[/prefix] (or allowed_s3 in its configuration file)"
                    .into(),
            });
        }
        if self.permits(&url.bucket, &url.key) {
            return Ok(());
        }
        let list: Vec<String> = self.prefixes.iter().map(S3Url::to_string).collect();
        Err(StorageError::S3NotAllowed {
            url: url.to_string(),
            reason: format!("it lies outside --allowed-s3 {}", list.join(", ")),
        })
    }

    /// Refuses an endpoint the configuration does not name (no endpoint: the environment's,
    /// or AWS's, always allowed).
    pub fn check_endpoint(&self, endpoint: Option<&str>) -> Result<(), StorageError> {
        let Some(e) = endpoint else { return Ok(()) };
        let normalized =
            normalize_endpoint(e).map_err(|reason| StorageError::S3Invalid { reason })?;
        if self.endpoints.contains(&normalized) {
            return Ok(());
        }
        let allowed = if self.endpoints.is_empty() {
            "none".to_owned()
        } else {
            self.endpoints.join(", ")
        };
        Err(StorageError::S3EndpointNotAllowed {
            endpoint: e.to_owned(),
            reason: format!(
                "the server sends its signed requests (and credentials) only to the endpoints \
                 its configuration names: AWS_ENDPOINT_URL in its environment and \
                 --allowed-s3-endpoint (allowed_s3_endpoints in its configuration file); \
                 allowed: {allowed}"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_list() {
        let allow = S3Allow::parse(
            &["s3://bkt/train".into(), "s3://other".into()],
            &["http://127.0.0.1:9000/".into()],
        )
        .unwrap();
        assert!(allow.check_endpoint(None).is_ok());
        assert!(allow.check_endpoint(Some("http://127.0.0.1:9000")).is_ok());
        let e = allow
            .check_endpoint(Some("http://evil.example:9000"))
            .unwrap_err();
        assert_eq!(e.code(), "endpoint_not_allowed");
        assert!(e.to_string().contains("--allowed-s3-endpoint"), "{e}");
        assert!(allow.permits("bkt", "train"));
        assert!(allow.permits("bkt", "train/a.jpg"));
        assert!(!allow.permits("bkt", "training/a.jpg"));
        assert!(!allow.permits("bkt", "val/a.jpg"));
        assert!(allow.permits("other", "anything/at/all"));
        let e = S3Allow::default()
            .check(&S3Url::parse("s3://bkt/train").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("--allowed-s3"), "{e}");
        let e = allow
            .check(&S3Url::parse("s3://nope/x").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("s3://bkt/train"), "{e}");
    }
}
