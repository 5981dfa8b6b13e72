//! Gateway configurations several test files start from.

/// A gateway on `upstream` and `store` (with `extra` top-level settings) whose status
/// endpoint is at `/idem/status` and whose callers are named by their `x-api-key` header;
/// `routes` follow.
pub fn with_status(upstream: &str, store: &str, extra: &str, routes: &str) -> String {
    format!(
        r#"
upstream = "{upstream}"
store = "{store}"
{extra}

[status]
path = "/idem/status"

[defaults]
principal = {{ from = "header", header = "x-api-key" }}

{routes}"#
    )
}
