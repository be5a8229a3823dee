//! The generated OpenAPI document: its error responses and codes come from the one table.
//! (That it names every route the real server answers is `tests/it`'s business.)

use serde_json::Value;

use super::{openapi, requires_token};
use crate::error::Code;

fn document() -> Value {
    serde_json::from_str(&openapi().to_json().unwrap()).unwrap()
}

/// (path, method, operation) of every operation of the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if op.get("responses").is_some() {
                out.push((path.clone(), method.clone(), op.clone()));
            }
        }
    }
    out
}

#[test]
fn every_error_response_carries_the_error_body() {
    let doc = document();
    let ops = operations(&doc);
    assert!(ops.len() >= 16, "only {} operations documented", ops.len());
    for (path, method, op) in &ops {
        let responses = op["responses"].as_object().unwrap();
        assert!(
            responses.contains_key("500"),
            "{method} {path} does not document 500 internal"
        );
        assert_eq!(
            responses.contains_key("401"),
            requires_token(path),
            "{method} {path}: 401 is documented exactly where a token is required"
        );
        for (status, response) in responses {
            let code: u16 = status.parse().unwrap();
            let schema = &response["content"]["application/json"]["schema"]["$ref"];
            if code >= 400 {
                assert_eq!(
                    schema, "#/components/schemas/Error",
                    "{method} {path} {status} does not carry the error body: {response}"
                );
                // The description names the codes of this status, from the table.
                let described = response["description"].as_str().unwrap();
                let codes: Vec<_> = Code::ALL
                    .iter()
                    .filter(|c| described.contains(&format!("`{}`", c.as_str())))
                    .collect();
                assert!(!codes.is_empty(), "{method} {path} {status}: {described}");
                for c in codes {
                    assert_eq!(
                        c.http_status(),
                        code,
                        "{method} {path}: {c:?} under {status}"
                    );
                }
            } else {
                // 101: a WebSocket upgrade (the follower's stream) switches protocols.
                assert!(code >= 200 || code == 101, "{method} {path} {status}");
            }
        }
    }
}

#[test]
fn the_error_schema_lists_every_code_with_its_status() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["Error"]["properties"]["error"]["$ref"],
        "#/components/schemas/ErrorDetail"
    );
    assert_eq!(
        schemas["ErrorDetail"]["properties"]["code"]["$ref"],
        "#/components/schemas/ErrorCode"
    );
    let code = &schemas["ErrorCode"];
    let names: Vec<&str> = code["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let all: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(names, all);
    let description = code["description"].as_str().unwrap();
    for c in Code::ALL {
        assert!(
            description.contains(&format!("`{}` ({})", c.as_str(), c.http_status())),
            "{c:?} is missing from the ErrorCode description"
        );
    }
}

#[test]
fn every_schema_reference_resolves() {
    let doc = document();
    let text = doc.to_string();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for piece in text.split("\"#/components/schemas/").skip(1) {
        let name = &piece[..piece.find('"').unwrap()];
        assert!(schemas.contains_key(name), "no schema {name}");
    }
}
