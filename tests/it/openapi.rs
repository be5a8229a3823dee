//! The generated OpenAPI document against the real server: every route it names is one the
//! server routes (never the router's 404), and every answer has a documented status.

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
    // The check above can fail: a path the document does not name is the router's 404.
    let (status, answer) = c.call("GET", "/v1/not-a-route", None).unwrap();
    assert!(unrouted(status, &answer), "{status} {answer}");
}
