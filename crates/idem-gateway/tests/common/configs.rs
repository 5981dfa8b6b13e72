//! Gateway configurations several test files start from.

/// A gateway on `upstream` and `store` (with `extra` top-level settings) whose status
/// endpoint is at `/idem/status` and whose callers are named by their `x-api-key` header;
/// `routes` follow.
pub fn with_status(upstream: &str, store: &str, extra: &str, routes: &str) -> String {
    keyed(
        upstream,
        store,
        &format!("{extra}\n\n[status]\npath = \"/idem/status\""),
        "",
        routes,
    )
}

/// A gateway on `upstream` and `store` (with `extra` top-level settings) whose callers are
/// named by their `x-api-key` header, with `defaults` added to the `[defaults]` table; `rest`
/// follows, and must open with a table.
pub fn keyed(upstream: &str, store: &str, extra: &str, defaults: &str, rest: &str) -> String {
    gateway(
        upstream,
        store,
        extra,
        r#"{ from = "header", header = "x-api-key" }"#,
        defaults,
        rest,
    )
}

/// The head every configuration here shares: `upstream` and `store` with `extra` top-level
/// settings, the `[defaults]` table naming callers by `principal` with `defaults` added, then
/// `rest`.
fn gateway(
    upstream: &str,
    store: &str,
    extra: &str,
    principal: &str,
    defaults: &str,
    rest: &str,
) -> String {
    format!(
        r#"
upstream = "{upstream}"
store = "{store}"
{extra}

[defaults]
principal = {principal}
{defaults}

{rest}"#
    )
}

/// The protected gRPC `Charge` route at `path`: keyed by the `idempotency-key` metadata,
/// fingerprinted on the raw message, replaying the gRPC status trailers; `more` settings of
/// the route follow.
pub fn grpc_charge(path: &str, more: &str) -> String {
    format!(
        r#"
[[routes]]
name = "charge"
method = "POST"
path = "{path}"
key_header = "idempotency-key"
fingerprint = {{ body = "raw" }}
replay_headers = ["content-type", "grpc-status", "grpc-message"]
{more}
"#
    )
}

/// A gateway on `upstream` and `store` (with `extra` top-level settings) whose callers are
/// anonymous (`principal = none`), with `defaults` added to the `[defaults]` table; `rest`
/// follows, and must open with a table (`[[routes]]`, `[admin]`, …) since anything before
/// one would land in `[defaults]`. The head nearly every gateway test writes.
pub fn anonymous(upstream: &str, store: &str, extra: &str, defaults: &str, rest: &str) -> String {
    gateway(
        upstream,
        store,
        extra,
        r#"{ from = "none" }"#,
        defaults,
        rest,
    )
}

/// The `[admin]` table: a listener on a spare loopback port that takes
/// [`ADMIN_TOKEN`](super::ADMIN_TOKEN), with `more` settings of the table after the token.
pub fn admin_table(more: &str) -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"
token = "{}"
{more}
"#,
        super::ADMIN_TOKEN
    )
}

/// [`anonymous`] with an admin listener ([`admin_table`]) as well: for the tests that look at
/// the gateway through its admin API too.
pub fn with_admin(upstream: &str, store: &str, extra: &str, defaults: &str, rest: &str) -> String {
    anonymous(
        upstream,
        store,
        extra,
        defaults,
        &format!("{}\n{rest}", admin_table("")),
    )
}

/// An anonymous gateway on `upstream` over the memory store (with `extra` top-level
/// settings) with an unprotected route at `/plain/*` and a protected `POST` route at `/p/*`:
/// the pair the protocol tests send the same exchange through.
pub fn plain_and_protected(upstream: &str, extra: &str) -> String {
    anonymous(upstream, "memory:", extra, "", PLAIN_AND_PROTECTED)
}

/// The routes of [`plain_and_protected`].
const PLAIN_AND_PROTECTED: &str = r#"
[[routes]]
name = "plain"
path = "/plain/*"
idempotency = false

[[routes]]
name = "protected"
method = "POST"
path = "/p/*"
"#;

/// An anonymous gateway on `upstream` over the memory store with `limits` as its `[limits]`
/// table; `rest` follows, and must open with a table (see [`anonymous`]).
pub fn limited(upstream: &str, limits: &str, rest: &str) -> String {
    anonymous(
        upstream,
        "memory:",
        &format!("[limits]\n{limits}"),
        "",
        rest,
    )
}
