//! The agent's requests to the leader: JSON POSTs with `awc`, actix's asynchronous HTTP
//! client (never blocking the actor), on connections with `TCP_NODELAY`.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// An error of a call to the leader: the leader's code, or unreachable.
#[derive(Debug, Clone)]
pub struct CallError {
    pub status: Option<u16>,
    pub code: Option<String>,
    pub message: String,
}

/// POSTs `body` to the leader and reads the JSON answer.
pub(super) async fn post<T: DeserializeOwned>(
    client: &awc::Client,
    url: String,
    token: Option<&str>,
    timeout: Duration,
    body: &impl Serialize,
) -> std::result::Result<T, CallError> {
    let mut req = client.post(&url).timeout(timeout);
    if let Some(t) = token {
        req = req.insert_header(("authorization", format!("Bearer {t}")));
    }
    let mut resp = req.send_json(body).await.map_err(|e| CallError {
        status: None,
        code: None,
        message: format!("POST {url}: {e}"),
    })?;
    let status = resp.status().as_u16();
    let bytes = resp.body().limit(256 << 20).await.map_err(|e| CallError {
        status: Some(status),
        code: None,
        message: format!("POST {url}: {e}"),
    })?;
    if !(200..300).contains(&status) {
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        return Err(CallError {
            status: Some(status),
            code: v["error"]["code"].as_str().map(String::from),
            message: v["error"]["message"]
                .as_str()
                .unwrap_or("no message")
                .to_string(),
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| CallError {
        status: Some(status),
        code: None,
        message: format!("POST {url}: unexpected answer: {e}"),
    })
}

/// awc's client with `TCP_NODELAY` on its connections: a stream writes small frames back to
/// back, which Nagle's algorithm would hold until the leader acknowledged the previous one
/// (a request waits for its answer, so requests never met it).
pub(super) fn client() -> awc::Client {
    use actix_service::ServiceExt;
    use actix_tls::connect::{Connection, ConnectorService};
    let tcp = ConnectorService::default().map(
        |c: Connection<awc::http::Uri, actix_web::rt::net::TcpStream>| {
            let _ = c.io_ref().set_nodelay(true);
            c
        },
    );
    awc::Client::builder()
        .connector(awc::Connector::new().connector(tcp))
        .finish()
}
