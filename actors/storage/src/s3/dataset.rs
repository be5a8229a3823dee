//! One bucket opened with the server's credentials ([`S3Dataset`]): where the credentials come
//! from (the environment only, never instance metadata), and the redaction that keeps them
//! out of every message.

use std::path::PathBuf;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{ClientConfigKey, RetryConfig};

use super::url::{S3Url, normalize_endpoint};
use crate::StorageError;

/// One bucket opened with the server's credentials.
#[derive(Clone)]
pub struct S3Dataset {
    pub(super) url: S3Url,
    pub(super) store: AmazonS3,
    /// Secrets that must never appear in a message (a store may echo them in an error body).
    secrets: Vec<String>,
}

impl S3Dataset {
    /// Opens the bucket of `url`. Fails at once when the environment holds no credentials.
    pub fn open(
        url: &S3Url,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> Result<Self, StorageError> {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&url.bucket)
            // Retries are the fetch stage's (counted, within its budget, never on 4xx).
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        if let Some(e) = endpoint {
            // Checked against the allowed endpoints in this form.
            b = b.with_endpoint(normalize_endpoint(e).unwrap_or_else(|_| e.to_owned()));
        }
        if let Some(r) = region {
            b = b.with_region(r);
        }
        let value = |k: AmazonS3ConfigKey| b.get_config_value(&k).filter(|v| !v.is_empty());
        let bad = |reason: String| StorageError::S3Credentials { reason };
        let (key, secret) = (
            value(AmazonS3ConfigKey::AccessKeyId),
            value(AmazonS3ConfigKey::SecretAccessKey),
        );
        let web_identity = value(AmazonS3ConfigKey::WebIdentityTokenFile).is_some()
            && value(AmazonS3ConfigKey::RoleArn).is_some();
        let container = value(AmazonS3ConfigKey::ContainerCredentialsRelativeUri).is_some()
            || value(AmazonS3ConfigKey::ContainerCredentialsFullUri).is_some();
        let unsigned = value(AmazonS3ConfigKey::SkipSignature).as_deref() == Some("true");
        match (&key, &secret) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(bad(
                    "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the server's \
                     environment"
                        .into(),
                ));
            }
            (None, None) if !(web_identity || container || unsigned) => {
                return Err(bad(
                    "the server's environment holds no credentials: set AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or \
                     AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or AWS_SKIP_SIGNATURE=true \
                     for a public bucket; instance metadata is not probed"
                        .into(),
                ));
            }
            _ => {}
        }
        let target = value(AmazonS3ConfigKey::Endpoint);
        let http_allowed = value(AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
            .is_some_and(|v| v == "true");
        if target.as_deref().is_some_and(|e| e.starts_with("http://")) && !http_allowed {
            return Err(bad(format!(
                "the endpoint {} is plain http: set AWS_ALLOW_HTTP=true in the server's \
                 environment to allow it",
                target.unwrap_or_default()
            )));
        }
        let secrets = [key, secret, value(AmazonS3ConfigKey::Token)]
            .into_iter()
            .flatten()
            .filter(|s| s.len() >= 4)
            .collect();
        let store = b.build().map_err(|e| StorageError::Remote {
            url: url.to_string(),
            code: "s3_config",
            message: e.to_string().to_lowercase(),
        })?;
        Ok(Self {
            url: url.clone(),
            store,
            secrets,
        })
    }

    /// `s3://bucket/key`.
    pub(super) fn name(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.url.bucket)
    }

    /// The error for an object (or prefix) `key` the store does not hold.
    pub(super) fn not_found(&self, key: &str) -> StorageError {
        StorageError::NotFound {
            path: PathBuf::from(self.name(key)),
        }
    }

    /// `message` with every credential replaced.
    pub(super) fn redact(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for s in &self.secrets {
            out = out.replace(s.as_str(), "***");
        }
        out
    }
}

/// The object path of a key recorded in an index.
pub(super) fn object_key(key: &str) -> Key {
    Key::parse(key).unwrap_or_else(|_| Key::from(key))
}
