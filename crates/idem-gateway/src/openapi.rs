//! The OpenAPI 3.1 description of everything the gateway answers itself: the idempotency
//! headers and problems of protected routes, the status endpoint, token issue and use, and the
//! admin API. Built from the code's own tables (every [`Reason`] with its status and problem
//! type, the header names), served at `GET /openapi.json` on the admin listener, printed by
//! `idem openapi`, and kept in `docs/openapi.json` (a test fails when the file and this drift).
//!
//! Paths the operator configures are placeholders: `/{route}` is any protected route,
//! `/{route}/token` a token route's `issue` path, `/idem/status/{key}` the status endpoint at
//! the `status.path` the examples use.

use idem_wire::header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, X_REQUEST_ID};
use idem_wire::{PROBLEM_BASE, Reason};
use serde_json::{Map, Value, json};

/// Admin endpoints the document describes (each is a route of the admin router).
pub const ADMIN_PATHS: [&str; 9] = [
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/admin/records",
    "/admin/record",
    "/admin/record/resolve",
    "/admin/reload",
    "/admin/audit",
];

/// The statuses protected-route answers of idem's own can have.
const ROUTE_STATUSES: [u16; 11] = [400, 401, 408, 409, 413, 422, 428, 500, 502, 503, 504];

/// The document.
pub fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "idem gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "What the idem gateway answers itself, in front of any HTTP service: \
                the idempotency headers and RFC 9457 problems of protected routes, the status \
                endpoint, token routes and the admin API. Configured paths are placeholders: \
                `/{route}` is any protected route, `/{route}/token` a token route's issue path. \
                The admin API is served on its own listener (`admin.listen`).",
            "license": {"name": "MIT OR Apache-2.0", "identifier": "MIT OR Apache-2.0"}
        },
        "paths": paths(),
        "components": components(),
    })
}

/// The document as the pretty JSON `docs/openapi.json` holds.
pub fn pretty() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

fn problem_ref(status: u16) -> Value {
    json!({"$ref": format!("#/components/responses/Problem{status}")})
}

fn problems(statuses: &[u16]) -> Map<String, Value> {
    statuses
        .iter()
        .map(|s| (s.to_string(), problem_ref(*s)))
        .collect()
}

fn header_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "header", "required": false, "description": description,
           "schema": {"type": "string"}})
}

fn protected_operation(method: &str) -> Value {
    let mut responses = problems(&ROUTE_STATUSES);
    responses.insert(
        "default".into(),
        json!({
            "description": "The upstream's answer: on the first request as it answered, on a \
                retry the stored answer with `Idempotent-Replayed: true`.",
            "headers": {
                IDEMPOTENT_REPLAYED.as_str(): {"$ref": "#/components/headers/IdempotentReplayed"},
                IDEMPOTENCY_KEY.as_str(): {"description": "The request's key, echoed on replays.",
                    "schema": {"type": "string"}}
            }
        }),
    );
    json!({
        "summary": format!("{method} through a protected route"),
        "description": "Runs at most once per key: the first request is forwarded and its \
            answer stored (by the route's status rules); a retry with the same key and request \
            gets the stored answer; a concurrent duplicate gets `409 in-flight`; the same key \
            with another request gets `422 key-reused`. A token route takes the \
            `Idempotency-Token` an issue returned instead of a key.",
        "operationId": format!("protected{}", method[..1].to_uppercase() + &method[1..].to_lowercase()),
        "parameters": [
            {"$ref": "#/components/parameters/route"},
            header_param(IDEMPOTENCY_KEY.as_str(), "1-255 printable ASCII characters, one per logical operation, reused on every retry (or the route's configured key source)."),
            header_param("Idempotency-Token", "On a token route: the token from its issue path (64 lowercase hex digits)."),
            header_param(X_REQUEST_ID.as_str(), "Kept on the record and in the audit trail."),
        ],
        "requestBody": {"required": false, "content": {"*/*": {"schema": {}}}},
        "responses": responses,
    })
}

fn paths() -> Value {
    merge(data_plane_paths(), &admin_paths())
}

/// What the data listener answers: protected routes, token issue and the status endpoint.
fn data_plane_paths() -> Value {
    let protected: Map<String, Value> = ["post", "put", "patch", "delete"]
        .iter()
        .map(|m| ((*m).to_owned(), protected_operation(&m.to_uppercase())))
        .collect();
    json!({
        "/{route}": protected,
        "/{route}/token": {
            "post": {
                "summary": "Issue a one-time token for a token route",
                "operationId": "issueToken",
                "parameters": [{"$ref": "#/components/parameters/route"}],
                "responses": {
                    "201": {"description": "A token bound to the caller's principal and this route.",
                        "headers": {"Cache-Control": {"schema": {"const": "no-store"}}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IssuedToken"}}}},
                    "401": problem_ref(401),
                    "405": {"description": "Another method than POST."},
                    "429": problem_ref(429),
                    "503": problem_ref(503)
                }
            }
        },
        "/idem/status/{key}": {
            "get": {
                "summary": "What became of a key (ask instead of resending blind)",
                "operationId": "keyStatus",
                "parameters": [
                    {"name": "key", "in": "path", "required": true, "schema": {"type": "string"},
                     "description": "The key, percent-encoded as one path segment."},
                    {"name": "route", "in": "query", "required": false, "schema": {"type": "string"},
                     "description": "The route whose scope the key is looked up in (needed when several routes are protected)."},
                    {"name": "namespace", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "answer", "in": "query", "required": false, "schema": {"enum": ["1"]},
                     "description": "For a completed key: the stored answer itself, as a retry would replay it."}
                ],
                "responses": {
                    "200": {"description": "`processing` (with `Retry-After`), `completed` or `unknown`; with `answer=1` on a completed key, the stored answer with `Idempotent-Replayed: true`.",
                        "headers": {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KeyStatus"}}}},
                    "400": problem_ref(400),
                    "401": problem_ref(401),
                    "404": {"description": "`absent`: no record for this caller's key; resending with the same key is safe.",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KeyStatus"}}}},
                    "405": {"description": "Another method than GET or HEAD."},
                    "409": problem_ref(409),
                    "503": problem_ref(503)
                }
            }
        }
    })
}

/// What the admin listener answers.
fn admin_paths() -> Value {
    let admin_server = json!([{"url": "http://127.0.0.1:9091", "description": "the admin listener (`admin.listen`)"}]);
    let bearer = json!([{"adminToken": []}]);
    let scrape = json!([{"adminToken": []}, {"metricsToken": []}]);
    let record_query = json!([
        {"name": "namespace", "in": "query", "required": true, "schema": {"type": "string"}},
        {"name": "key", "in": "query", "required": true, "schema": {"type": "string"}},
        {"name": "principal", "in": "query", "required": false, "schema": {"type": "string"},
         "description": "The stored principal (`h:…` for a header credential); omit for routes without one."},
        {"name": "credential", "in": "query", "required": false, "schema": {"type": "string"},
         "description": "A caller's credential, from which the principal is derived as the data plane derives it."}
    ]);
    let admin_errors = json!({
        "401": {"$ref": "#/components/responses/AdminUnauthorized"},
        "503": {"$ref": "#/components/responses/AdminError"}
    });
    let mut with_404 = admin_errors.clone();
    with_404["404"] = json!({"$ref": "#/components/responses/AdminError"});
    json!({
        "/healthz": {"servers": admin_server, "get": {"summary": "Liveness", "operationId": "healthz", "security": [],
            "responses": {"200": {"description": "The process runs.", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/readyz": {"servers": admin_server, "get": {"summary": "Readiness", "operationId": "readyz", "security": [],
            "responses": {"200": {"description": "The store answers."}, "503": {"description": "The store does not answer."}}}},
        "/metrics": {"servers": admin_server, "get": {"summary": "Prometheus metrics", "operationId": "metrics", "security": scrape,
            "responses": {"200": {"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}},
                          "401": {"$ref": "#/components/responses/AdminUnauthorized"}}}},
        "/openapi.json": {"servers": admin_server, "get": {"summary": "This document", "operationId": "openapi", "security": [],
            "responses": {"200": {"description": "OpenAPI 3.1.", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        "/admin/records": {"servers": admin_server, "get": {"summary": "List records, oldest first", "operationId": "listRecords", "security": bearer,
            "parameters": [
                {"name": "state", "in": "query", "schema": {"enum": ["processing", "completed", "unknown"]}},
                {"name": "older_than", "in": "query", "schema": {"type": "string"}, "description": "A duration such as `5m`."},
                {"name": "namespace", "in": "query", "schema": {"type": "string"}},
                {"name": "principal", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}}
            ],
            "responses": merge(json!({"200": {"description": "Records.", "content": {"application/json": {"schema": {"type": "object"}}}}, "400": {"$ref": "#/components/responses/AdminError"}}), &admin_errors)}},
        "/admin/record": {"servers": admin_server,
            "get": {"summary": "One record", "operationId": "getRecord", "security": bearer, "parameters": record_query,
                "responses": merge(json!({"200": {"description": "The record.", "content": {"application/json": {"schema": {"type": "object"}}}}}), &with_404)},
            "delete": {"summary": "Delete a record whatever its state (recorded in the audit trail)", "operationId": "deleteRecord", "security": bearer,
                "parameters": merge_params(&record_query, &json!([{"$ref": "#/components/parameters/actor"}])),
                "responses": merge(json!({"200": {"description": "Deleted."}}), &with_404)}},
        "/admin/record/resolve": {"servers": admin_server, "post": {"summary": "Settle an unknown (or expired processing) record", "operationId": "resolveRecord", "security": bearer,
            "parameters": merge_params(&record_query, &json!([{"$ref": "#/components/parameters/actor"}])),
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Resolve"}}}},
            "responses": merge(json!({"200": {"description": "Settled."}, "400": {"$ref": "#/components/responses/AdminError"}, "409": {"$ref": "#/components/responses/AdminError"}}), &with_404)}},
        "/admin/reload": {"servers": admin_server, "post": {"summary": "Reload the configuration", "operationId": "reload", "security": bearer,
            "responses": merge(json!({"200": {"description": "Reloaded."}, "400": {"$ref": "#/components/responses/AdminError"}}), &with_404)}},
        "/admin/audit": {"servers": admin_server, "get": {"summary": "The audit trail, newest first", "operationId": "audit", "security": bearer,
            "parameters": [
                {"name": "namespace", "in": "query", "schema": {"type": "string"}},
                {"name": "key", "in": "query", "schema": {"type": "string"}},
                {"name": "scope", "in": "query", "schema": {"type": "string"}},
                {"name": "state", "in": "query", "schema": {"type": "string"}},
                {"name": "since", "in": "query", "schema": {"type": "string"}},
                {"name": "until", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}}
            ],
            "responses": merge(json!({"200": {"description": "Events, and with `namespace` and `key` the key's record.", "content": {"application/json": {"schema": {"type": "object", "required": ["events", "level"]}}}}, "400": {"$ref": "#/components/responses/AdminError"}}), &admin_errors)}}
    })
}

fn merge(mut a: Value, b: &Value) -> Value {
    if let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object()) {
        for (k, v) in b {
            a.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    a
}

fn merge_params(a: &Value, b: &Value) -> Value {
    let mut all = a.as_array().cloned().unwrap_or_default();
    all.extend(b.as_array().cloned().unwrap_or_default());
    Value::Array(all)
}

/// One response per status idem answers with, listing the problem types it can carry there.
fn problem_responses() -> Map<String, Value> {
    let mut statuses: Vec<u16> = Reason::ALL
        .iter()
        .map(|r| r.http_status().as_u16())
        .collect();
    statuses.sort_unstable();
    statuses.dedup();
    statuses
        .into_iter()
        .map(|status| {
            let of: Vec<Reason> = Reason::ALL
                .into_iter()
                .filter(|r| r.http_status().as_u16() == status)
                .collect();
            let types: Vec<String> = of.iter().map(|r| r.type_uri()).collect();
            let listed: Vec<String> = of
                .iter()
                .map(|r| format!("`{}` ({})", r.slug(), r.title()))
                .collect();
            let mut headers = Map::new();
            if [409, 429, 503].contains(&status) {
                headers.insert(
                    "Retry-After".into(),
                    json!({"$ref": "#/components/headers/RetryAfter"}),
                );
            }
            let response = json!({
                "description": format!("idem's own answer: {}.", listed.join(", ")),
                "headers": headers,
                "content": {"application/problem+json": {"schema": {
                    "allOf": [{"$ref": "#/components/schemas/Problem"}],
                    "properties": {"type": {"enum": types}, "status": {"const": status}}
                }}}
            });
            (format!("Problem{status}"), response)
        })
        .collect()
}

fn components() -> Value {
    let all_types: Vec<String> = Reason::ALL.iter().map(|r| r.type_uri()).collect();
    let problems: Vec<Value> = Reason::ALL
        .iter()
        .map(|r| {
            json!({"type": r.type_uri(), "slug": r.slug(), "title": r.title(),
                   "status": r.http_status().as_u16(), "grpc_code": r.grpc_code().number(),
                   "reason": r.as_str()})
        })
        .collect();
    json!({
        "parameters": {
            "route": {"name": "route", "in": "path", "required": true, "schema": {"type": "string"},
                "description": "A path the configuration protects (placeholder)."},
            "actor": {"name": "X-Idem-Actor", "in": "header", "required": false, "schema": {"type": "string"},
                "description": "Who acts, for the audit trail (`admin:<name>`)."}
        },
        "headers": {
            "IdempotentReplayed": {"description": "`true` on an answer replayed from the record.", "schema": {"const": "true"}},
            "RetryAfter": {"description": "Seconds before trying again.", "schema": {"type": "integer", "minimum": 0}}
        },
        "securitySchemes": {
            "adminToken": {"type": "http", "scheme": "bearer", "description": "`admin.token`."},
            "metricsToken": {"type": "http", "scheme": "bearer", "description": "`admin.metrics_token` (read-only, `/metrics` only)."}
        },
        "responses": merge(Value::Object(problem_responses()), &json!({
            "AdminUnauthorized": {"description": "No or a wrong admin token."},
            "AdminError": {"description": "The request was refused or the store failed.",
                "content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "string"}}}}}}
        })),
        "schemas": {
            "Problem": {
                "type": "object",
                "description": "RFC 9457 problem details. `type` is one of idem's problem types (each listed with its status, gRPC code and `ErrorInfo` reason in `x-idem-problems`).",
                "required": ["type", "title", "status"],
                "properties": {
                    "type": {"type": "string", "format": "uri", "enum": all_types},
                    "title": {"type": "string"},
                    "status": {"type": "integer"},
                    "detail": {"type": "string"},
                    "key": {"type": "string", "description": "The idempotency key, when the request had one."},
                    "state": {"type": "string"},
                    "retry_after": {"type": "integer", "minimum": 0}
                },
                "x-idem-problem-base": PROBLEM_BASE,
                "x-idem-problems": problems
            },
            "KeyStatus": {
                "type": "object",
                "required": ["key", "state"],
                "properties": {
                    "key": {"type": "string"},
                    "namespace": {"type": "string"},
                    "state": {"enum": ["absent", "processing", "completed", "unknown"]},
                    "created_at": {"type": "integer", "description": "ms since the Unix epoch, store clock"},
                    "expires_at": {"type": "integer"},
                    "completed_at": {"type": "integer"},
                    "lease_until": {"type": "integer"},
                    "status": {"type": "integer", "description": "The stored answer's status (completed)."}
                }
            },
            "IssuedToken": {
                "type": "object",
                "required": ["token", "expires_at", "header"],
                "properties": {
                    "token": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "expires_at": {"type": "string", "format": "date-time"},
                    "header": {"type": "string"}
                }
            },
            "Resolve": {
                "type": "object",
                "required": ["outcome"],
                "properties": {
                    "outcome": {"enum": ["release", "complete"]},
                    "status": {"type": "integer"},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                    "body": {"type": "string"},
                    "ttl": {"type": "string"}
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json` is this document: regenerate it with `idem openapi > docs/openapi.json`.
    #[test]
    fn the_committed_file_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == pretty(),
            "docs/openapi.json drifted from the code: run `idem openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn every_reason_is_described_with_its_status() {
        let doc = document();
        let listed = doc["components"]["schemas"]["Problem"]["x-idem-problems"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(listed.len(), Reason::ALL.len());
        for r in Reason::ALL {
            let status = r.http_status().as_u16();
            let response = &doc["components"]["responses"][format!("Problem{status}")];
            let types = &response["content"]["application/problem+json"]["schema"]["properties"]["type"]
                ["enum"];
            assert!(
                types
                    .as_array()
                    .is_some_and(|t| t.contains(&Value::String(r.type_uri()))),
                "{r:?} missing from Problem{status}"
            );
        }
    }

    #[test]
    fn every_admin_path_is_described() {
        let doc = document();
        for path in ADMIN_PATHS {
            assert!(doc["paths"][path].is_object(), "{path}");
        }
        for status in ROUTE_STATUSES {
            assert!(
                doc["components"]["responses"][format!("Problem{status}")].is_object(),
                "no idem answer has status {status}"
            );
        }
    }
}
