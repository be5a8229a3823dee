//! What an `s3` source names, checked for syntax before any access check or request: its
//! `s3://bucket/key` url, its endpoint (the form endpoints are compared in) and its region.

use std::fmt;

use crate::StorageError;

/// `s3://bucket/key`, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    /// The key or key prefix (no leading `/`; may be empty).
    pub key: String,
}

impl S3Url {
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("'{url}' is not an s3:// url (s3://bucket/prefix)"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(format!(
                "'{url}' names no valid bucket (3 to 63 characters from a-z 0-9 . -)"
            ));
        }
        if key.split('/').any(|c| c == "." || c == "..") {
            return Err(format!("'{url}': a key may not contain . or .. components"));
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }

    /// The key as a folder prefix: empty, or ending in `/`.
    pub(super) fn folder(&self) -> String {
        folder_of(&self.key)
    }
}

pub(super) fn folder_of(key: &str) -> String {
    if key.is_empty() || key.ends_with('/') {
        key.to_owned()
    } else {
        format!("{key}/")
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// A region name: it becomes part of the AWS host name, so only `a-z 0-9 -` are taken
/// (anything else could steer signed requests to another host).
fn check_region(region: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&region.len())
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "region '{region}' must have 1 to 64 characters from a-z 0-9 -"
        ))
    }
}

/// An endpoint in the form endpoints are compared in: `http(s)://host[:port][/path]`, no
/// trailing `/`, host lowercased, no credentials, query or fragment.
pub fn normalize_endpoint(endpoint: &str) -> Result<String, String> {
    let bad = |why: &str| format!("endpoint '{endpoint}' {why}");
    let u = url::Url::parse(endpoint).map_err(|e| bad(&format!("is no url ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("must start with http:// or https://"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("may not carry credentials"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("may not have a query or fragment"));
    }
    Ok(u.as_str().trim_end_matches('/').to_owned())
}

/// Checks the syntax of what an `s3` source names (before any access check): its url, its
/// endpoint and its region. Errors are [`StorageError::S3Invalid`] (the request's fault).
pub fn validate(
    url: &str,
    endpoint: Option<&str>,
    region: Option<&str>,
) -> Result<S3Url, StorageError> {
    let invalid = |reason: String| StorageError::S3Invalid { reason };
    let parsed = S3Url::parse(url).map_err(invalid)?;
    if let Some(e) = endpoint {
        normalize_endpoint(e).map_err(invalid)?;
    }
    if let Some(r) = region {
        check_region(r).map_err(invalid)?;
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_endpoints_and_regions() {
        let u = S3Url::parse("s3://my-bucket/train/x").unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.key.as_str()),
            ("my-bucket", "train/x")
        );
        assert!(S3Url::parse("http://b/x").is_err());
        assert!(S3Url::parse("s3://B/x").is_err());
        assert!(S3Url::parse("s3://bkt/a/../b").is_err());
        assert_eq!(
            validate("s3://bkt/x", None, Some("evil.com/"))
                .unwrap_err()
                .code(),
            "invalid_s3_source"
        );
        assert_eq!(
            validate("s3:/bkt", None, None).unwrap_err().code(),
            "invalid_s3_source"
        );
        assert!(validate("s3://bkt/x", Some("ftp://h"), None).is_err());
        assert!(validate("s3://bkt/x", Some("http://u:p@h"), None).is_err());
    }
}
