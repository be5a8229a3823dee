//! The generated OpenAPI document against the real server: every route it names is one the
//! server routes (never the router's 404), every answer has a documented status, and a
//! method a path does not have is a 405 naming the ones it has.

use serde_json::{Value, json};

use crate::common::{TempDir, TestServer, unique_instance};

/// Whether a response is the router's own 404 (no route matched), as opposed to a handler's
/// (`dataset_not_found`, a missing dashboard file, …).
fn unrouted(status: u16, body: &Value) -> bool {
    status == 404
        && body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("no route for"))
}

/// Sends `method path` over a fresh connection and returns the response's head.
fn raw_request(addr: &str, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the server");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_openapi_document_names_routes_the_server_answers() {
    let state = TempDir::new("openapi");
    let server = TestServer::start(&unique_instance("openapi"), &state.0, &state.0, &[]);
    let c = server.client();
    let doc = c.ok("GET", "/v1/openapi.json", None).unwrap();
    let error_codes = &doc["components"]["schemas"]["ErrorCode"]["enum"];
    let paths = doc["paths"].as_object().expect("the document has paths");
    let mut asked = 0;
    for (path, item) in paths {
        // Every path parameter gets a name no dataset, job or file has.
        let concrete: String = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "zz-none" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        for (method, op) in item.as_object().unwrap() {
            let method = method.to_uppercase();
            let body = (method == "POST").then(|| json!({}));
            let (status, answer) = c
                .call(&method, &concrete, body.as_ref())
                .unwrap_or_else(|e| panic!("{method} {concrete}: {e}"));
            asked += 1;
            assert!(
                !unrouted(status, &answer),
                "{method} {path} is documented but the server has no route for it: {answer}"
            );
            assert!(
                op["responses"][status.to_string()].is_object(),
                "{method} {concrete} answered {status}, which its operation does not document: \
                 {answer}"
            );
            if status >= 400 {
                let code = &answer["error"]["code"];
                assert!(
                    error_codes.as_array().unwrap().contains(code),
                    "{method} {concrete}: code {code} is not in the ErrorCode schema"
                );
            }
        }
    }
    assert!(asked >= 16, "only {asked} operations documented");
    // Methods a documented path does not have: 405 with the documented ones in `Allow`.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    for (path, item) in paths {
        let concrete = path
            .replace("{name}", "zz-none")
            .replace("{file}", "zz-none");
        let documented: Vec<String> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|m| m.to_uppercase())
            .collect();
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            if documented.iter().any(|m| m == method) {
                continue;
            }
            let request = ureq::http::Request::builder()
                .method(method)
                .uri(format!("{}{concrete}", server.url))
                .body(())
                .unwrap();
            let mut response = agent.run(request).unwrap();
            let allow = response
                .headers()
                .get("allow")
                .map(|v| v.to_str().unwrap().to_string());
            let status = response.status().as_u16();
            let body: Value =
                serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (405, Some("method_not_allowed")),
                "{method} {concrete}: {body}"
            );
            let mut allowed: Vec<String> = allow
                .expect("a 405 has an Allow header")
                .split(", ")
                .map(str::to_string)
                .collect();
            allowed.sort();
            let mut expected = documented.clone();
            expected.sort();
            assert_eq!(allowed, expected, "Allow of {path}");
        }
    }
    // Any token is a method to HTTP (ureq sends only the standard ones): an invented one is
    // a 405 too, and invented methods are one label value of the request counter, whatever
    // their number (label values stay few: ARCHITECTURE.md).
    let addr = server.url.trim_start_matches("http://");
    for method in ["INVENTED", "INVENTED2"] {
        let head = raw_request(addr, method, "/v1/jobs");
        assert!(head.starts_with("HTTP/1.1 405"), "{method}: {head}");
        assert!(head.to_lowercase().contains("allow: get, post"), "{head}");
    }
    let metrics = crate::common::wait_for("the invented methods to be counted", || {
        let (_, text) = c.call("GET", "/metrics", None).ok()?;
        let text = text.as_str()?.to_string();
        text.contains("method=\"other\"").then_some(text)
    });
    assert!(!metrics.contains("INVENTED"), "{metrics}");
    // The check above can fail: a path the document does not name is the router's 404.
    let (status, answer) = c.call("GET", "/v1/not-a-route", None).unwrap();
    assert!(unrouted(status, &answer), "{status} {answer}");
}
