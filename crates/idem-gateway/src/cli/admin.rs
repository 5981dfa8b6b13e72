//! `idem admin`: the admin API from a shell. Records (`list`, `get`, `resolve`, `delete`) and
//! the audit trail of a key, as tables for people or JSON for scripts (`--json`).
//!
//! The token comes from `IDEM_ADMIN_TOKEN` or `--token-file` (its first line); the address
//! from `--url` or `IDEM_ADMIN_URL`. An `https://` admin listener is verified against the
//! system roots and `--ca-file` (or `IDEM_ADMIN_CA_FILE`). Changes are recorded in the audit trail as
//! `admin:<actor>` (`--actor`, default `cli`).
//!
//! Exit codes: 0 done; 1 failed (unreachable, server error, unreadable answer); 2 bad usage
//! or a request the API refused as malformed (400); 3 not found (404); 4 refused: the token
//! (401, 403) or the record's state (409, e.g. resolving a completed record).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::{Args, Subcommand};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use idem_http::RequestBody;
use serde_json::{Value, json};

use super::visible::visible;
use crate::admin::ACTOR_HEADER;
use crate::upstream::{Clients, HttpClient, RawUpstream, RawUpstreamTable, UpstreamSpec};

/// Exit code: done.
pub const EXIT_OK: u8 = 0;
/// Exit code: failed (unreachable, server error, unreadable answer).
pub const EXIT_FAILED: u8 = 1;
/// Exit code: bad usage or a malformed request.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: no such record or endpoint.
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit code: refused (token, or the record's state).
pub const EXIT_REFUSED: u8 = 4;

/// `idem admin`'s arguments.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The admin listener, e.g. http://127.0.0.1:9090 or https://admin.internal:9090.
    #[arg(long, env = "IDEM_ADMIN_URL", default_value = "http://127.0.0.1:9090")]
    url: String,
    /// PEM certificates trusted besides the system roots, for an https:// admin listener.
    #[arg(long, env = "IDEM_ADMIN_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// A file whose first line is the admin token (else `IDEM_ADMIN_TOKEN`).
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Who the audit trail names for changes: `admin:<actor>`.
    #[arg(long, default_value = "cli")]
    actor: String,
    /// JSON for scripts instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// How long to wait for the gateway.
    #[arg(long, default_value = "10s", value_parser = duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Records: list, get, resolve, delete.
    #[command(subcommand)]
    Records(RecordsCommand),
    /// The audit trail of a key, newest first. At the default audit level (`operator`) it
    /// holds no fresh claim or completion: the key's record, printed after it, tells them.
    Audit {
        /// The idempotency key.
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only this event (claimed, completed, released, unknown, taken_over, fenced,
        /// resolved, deleted, expired).
        #[arg(long)]
        event: Option<String>,
        /// Only events at or after this time (milliseconds since the epoch).
        #[arg(long)]
        since: Option<u64>,
        /// Only events at or before this time (milliseconds since the epoch).
        #[arg(long)]
        until: Option<u64>,
        /// At most this many events.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

#[derive(Debug, Subcommand)]
enum RecordsCommand {
    /// Lists records, oldest first.
    List {
        /// Only this state: processing, completed or unknown.
        #[arg(long)]
        state: Option<String>,
        /// Only this namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// Only this stored principal.
        #[arg(long)]
        principal: Option<String>,
        /// Only records at least this old, e.g. `5m`.
        #[arg(long)]
        older_than: Option<String>,
        /// At most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Shows one record.
    Get {
        /// The idempotency key.
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Settles an unknown (or expired processing) record.
    Resolve {
        /// The idempotency key.
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// The effect happened: replay this status to retries.
        #[arg(long, conflicts_with = "release", required_unless_present = "release")]
        complete: Option<u16>,
        /// The body replayed with `--complete`.
        #[arg(long, requires = "complete")]
        body: Option<String>,
        /// A header replayed with `--complete`, `name: value` (repeatable).
        #[arg(long = "header", requires = "complete")]
        headers: Vec<String>,
        /// The effect did not happen: free the key so a retry runs.
        #[arg(long)]
        release: bool,
    },
    /// Deletes a record whatever its state.
    Delete {
        /// The idempotency key.
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
    },
}

/// Which scope a key lives in.
#[derive(Debug, Args)]
struct ScopeArgs {
    /// The namespace (the route's).
    #[arg(long, short)]
    namespace: String,
    /// The stored principal (`h:…` for header credentials).
    #[arg(long, conflicts_with = "credential")]
    principal: Option<String>,
    /// The caller's credential, hashed into the principal as the gateway does.
    #[arg(long)]
    credential: Option<String>,
}

impl ScopeArgs {
    fn query(&self, key: &str) -> Vec<(&'static str, String)> {
        let mut q = vec![
            ("namespace", self.namespace.clone()),
            ("key", key.to_owned()),
        ];
        if let Some(p) = &self.principal {
            q.push(("principal", p.clone()));
        }
        if let Some(c) = &self.credential {
            q.push(("credential", c.clone()));
        }
        q
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// An answer of the admin API.
struct Answer {
    status: StatusCode,
    body: Value,
}

/// How to reach the admin listener at `base`: plain HTTP, or TLS verified against the system
/// roots and `ca_file`.
fn admin_spec(base: &str, ca_file: Option<std::path::PathBuf>) -> anyhow::Result<UpstreamSpec> {
    if !base.starts_with("http://") && !base.starts_with("https://") {
        anyhow::bail!("must be the http:// or https:// address of the admin listener");
    }
    UpstreamSpec::compile(&RawUpstream::Table(RawUpstreamTable {
        url: base.to_owned(),
        ca_file,
        ..RawUpstreamTable::default()
    }))
}

/// One admin API call: its method, path, query and JSON body.
struct AdminCall {
    method: Method,
    path: &'static str,
    query: Vec<(&'static str, String)>,
    body: Option<Value>,
}

impl AdminCall {
    /// A call without a body.
    fn new(method: Method, path: &'static str, query: Vec<(&'static str, String)>) -> Self {
        Self {
            method,
            path,
            query,
            body: None,
        }
    }
}

/// Where and as whom the admin API is called.
struct Admin<'a> {
    client: HttpClient,
    base: String,
    token: String,
    args: &'a AdminArgs,
}

/// Runs `idem admin …` and answers the exit code (see the module docs).
pub async fn run(args: AdminArgs) -> u8 {
    let token = match token(&args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let base = args.url.trim_end_matches('/').to_owned();
    let client = match admin_spec(&base, args.ca_file.clone()) {
        Ok(spec) => Clients::new(args.timeout, 1).get(&spec),
        Err(e) => {
            eprintln!("error: `--url`: {e:#}");
            return EXIT_USAGE;
        }
    };
    let admin = Admin {
        client,
        base,
        token,
        args: &args,
    };
    let call = match admin_call(&args.command) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let answer = match admin.send(call).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {}", visible(&e));
            return EXIT_FAILED;
        }
    };
    report(&args, &answer)
}

/// The admin API call a sub-command makes, or the exit code of arguments it cannot send.
fn admin_call(command: &AdminCommand) -> Result<AdminCall, u8> {
    Ok(match command {
        AdminCommand::Records(RecordsCommand::List {
            state,
            namespace,
            principal,
            older_than,
            limit,
        }) => records_list_call(state, namespace, principal, older_than, *limit),
        AdminCommand::Records(RecordsCommand::Get { key, scope }) => {
            AdminCall::new(Method::GET, "/admin/record", scope.query(key))
        }
        AdminCommand::Records(RecordsCommand::Delete { key, scope }) => {
            AdminCall::new(Method::DELETE, "/admin/record", scope.query(key))
        }
        AdminCommand::Records(RecordsCommand::Resolve {
            key,
            scope,
            complete,
            body,
            headers,
            release: _,
        }) => AdminCall {
            body: Some(resolution(*complete, body, headers)?),
            ..AdminCall::new(Method::POST, "/admin/record/resolve", scope.query(key))
        },
        AdminCommand::Audit {
            key,
            scope,
            event,
            since,
            until,
            limit,
        } => audit_call(key, scope, event, *since, *until, *limit),
    })
}

/// `records list`: the records matching the given filters.
fn records_list_call(
    state: &Option<String>,
    namespace: &Option<String>,
    principal: &Option<String>,
    older_than: &Option<String>,
    limit: usize,
) -> AdminCall {
    let mut q = vec![("limit", limit.to_string())];
    for (name, value) in [
        ("state", state),
        ("namespace", namespace),
        ("principal", principal),
        ("older_than", older_than),
    ] {
        if let Some(v) = value {
            q.push((name, v.clone()));
        }
    }
    AdminCall::new(Method::GET, "/admin/records", q)
}

/// `records resolve`'s body: complete with a status, body and headers, or release; a header
/// not written `name: value` is a usage error.
fn resolution(
    complete: Option<u16>,
    body: &Option<String>,
    headers: &[String],
) -> Result<Value, u8> {
    let Some(status) = complete else {
        return Ok(json!({ "outcome": "release" }));
    };
    let mut fields = serde_json::Map::new();
    for h in headers {
        let Some((name, value)) = h.split_once(':') else {
            eprintln!("error: `--header {h}`: write `name: value`");
            return Err(EXIT_USAGE);
        };
        fields.insert(name.trim().to_owned(), json!(value.trim()));
    }
    Ok(json!({
        "outcome": "complete",
        "status": status,
        "body": body.clone().unwrap_or_default(),
        "headers": fields,
    }))
}

/// `audit`: a key's events, filtered by event and time.
fn audit_call(
    key: &str,
    scope: &ScopeArgs,
    event: &Option<String>,
    since: Option<u64>,
    until: Option<u64>,
    limit: usize,
) -> AdminCall {
    let mut q = vec![
        ("namespace", scope.namespace.clone()),
        ("key", key.to_owned()),
        ("limit", limit.to_string()),
    ];
    if let Some(p) = &scope.principal {
        q.push(("scope", p.clone()));
    }
    if let Some(c) = &scope.credential {
        q.push(("credential", c.clone()));
    }
    if let Some(e) = event {
        q.push(("state", e.clone()));
    }
    if let Some(t) = since {
        q.push(("since", t.to_string()));
    }
    if let Some(t) = until {
        q.push(("until", t.to_string()));
    }
    AdminCall::new(Method::GET, "/admin/audit", q)
}

impl Admin<'_> {
    /// Sends `call` with the bearer token and actor, and reads the JSON answer within the
    /// timeout; the error names the URL.
    async fn send(&self, call: AdminCall) -> Result<Answer, String> {
        let mut url = format!("{}{}", self.base, call.path);
        if !call.query.is_empty() {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in &call.query {
                q.append_pair(k, v);
            }
            url.push('?');
            url.push_str(&q.finish());
        }
        let req = Request::builder()
            .method(call.method)
            .uri(&url)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(ACTOR_HEADER, self.args.actor.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(RequestBody::from(Bytes::from(
                call.body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .map_err(|e| format!("{url}: {e}"))?;
        let timeout = self.args.timeout;
        let exchange = async {
            let res = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let status = res.status();
            let bytes = res
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{url}: {e}"))?
                .to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or_else(
                |_| json!({ "error": String::from_utf8_lossy(&bytes).trim().to_owned() }),
            );
            Ok::<_, String>(Answer { status, body })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("{url}: no answer within {timeout:?}"))?
    }
}

/// Prints the answer (JSON, a table or a confirmation) and answers the exit code its status
/// maps to.
fn report(args: &AdminArgs, answer: &Answer) -> u8 {
    let code = match answer.status {
        s if s.is_success() => EXIT_OK,
        StatusCode::NOT_FOUND => EXIT_NOT_FOUND,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::CONFLICT => EXIT_REFUSED,
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => EXIT_USAGE,
        _ => EXIT_FAILED,
    };
    if code != EXIT_OK {
        let why = visible(answer.body["error"].as_str().unwrap_or("")).into_owned();
        if args.json {
            println!("{}", answer.body);
        }
        eprintln!("error: {} {why}", answer.status);
        return code;
    }
    if args.json {
        println!("{}", answer.body);
        return EXIT_OK;
    }
    match &args.command {
        AdminCommand::Records(RecordsCommand::List { .. }) => print_records(&answer.body),
        AdminCommand::Records(RecordsCommand::Get { .. }) => print_record(&answer.body),
        AdminCommand::Records(RecordsCommand::Resolve { key, .. }) => {
            println!("resolved {}", visible(key));
        }
        AdminCommand::Records(RecordsCommand::Delete { key, .. }) => {
            println!("deleted {}", visible(key));
        }
        AdminCommand::Audit { .. } => print_audit(&answer.body),
    }
    EXIT_OK
}

/// The token: `--token-file`'s first line, else `IDEM_ADMIN_TOKEN`.
fn token(args: &AdminArgs) -> Result<String, String> {
    let token = match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_owned(),
        None => std::env::var("IDEM_ADMIN_TOKEN")
            .unwrap_or_default()
            .trim()
            .to_owned(),
    };
    if token.is_empty() {
        return Err("no admin token: set IDEM_ADMIN_TOKEN or pass --token-file".into());
    }
    Ok(token)
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        // Stored strings come from callers and upstreams: never raw to the terminal.
        Value::String(s) => visible(s).into_owned(),
        other => visible(&other.to_string()).into_owned(),
    }
}

fn time(v: &Value) -> String {
    match v.as_u64() {
        Some(ms) => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        }
        None => "-".into(),
    }
}

fn age(v: &Value) -> String {
    let Some(ms) = v.as_u64() else {
        return "-".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let secs = now.saturating_sub(ms) / 1000;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// Prints rows under a header, each column as wide as its widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn print_records(body: &Value) {
    let rows: Vec<Vec<String>> = body["records"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            vec![
                cell(&r["state"]),
                cell(&r["namespace"]),
                cell(&r["principal"]),
                cell(&r["key"]),
                cell(&r["fence"]),
                age(&r["created_at_ms"]),
                cell(&r["request_id"]),
            ]
        })
        .collect();
    table(
        &[
            "STATE",
            "NAMESPACE",
            "PRINCIPAL",
            "KEY",
            "FENCE",
            "AGE",
            "REQUEST ID",
        ],
        &rows,
    );
    println!("{} records", rows.len());
}

fn print_record(r: &Value) {
    let mut rows = vec![
        ("key", cell(&r["key"])),
        ("namespace", cell(&r["namespace"])),
        ("principal", cell(&r["principal"])),
        ("state", cell(&r["state"])),
        ("fence", cell(&r["fence"])),
        ("request id", cell(&r["request_id"])),
        ("created", time(&r["created_at_ms"])),
        ("expires", time(&r["expires_at_ms"])),
    ];
    if r["state"] == "processing" {
        rows.push(("owner", cell(&r["owner"])));
        rows.push(("lease until", time(&r["lease_until_ms"])));
    }
    if r["state"] == "unknown" {
        rows.push(("unknown since", time(&r["unknown_since_ms"])));
    }
    if r["state"] == "completed" {
        rows.push(("completed", time(&r["completed_at_ms"])));
        rows.push(("status", cell(&r["response"]["status"])));
        rows.push(("body", cell(&r["response"]["body"])));
    }
    for (name, value) in rows {
        println!("{name:<14} {value}");
    }
}

fn print_audit(body: &Value) {
    let rows: Vec<Vec<String>> = body["events"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|e| {
            vec![
                time(&e["at_ms"]),
                cell(&e["event"]),
                cell(&e["fence"]),
                cell(&e["outcome"]),
                cell(&e["status"]),
                cell(&e["instance"]),
                cell(&e["actor"]),
                cell(&e["request_id"]),
            ]
        })
        .collect();
    table(
        &[
            "TIME",
            "EVENT",
            "FENCE",
            "OUTCOME",
            "STATUS",
            "INSTANCE",
            "ACTOR",
            "REQUEST ID",
        ],
        &rows,
    );
    // On stderr, so the table stays the only thing on stdout.
    if body["level"] == "operator" {
        if let Some(line) = record_line(&body["record"]) {
            eprintln!("{line}");
        }
        eprintln!(
            "note: audit level `operator`: a fresh claim and its completion are not in the trail \
             (the record tells them); `[audit] level = \"all\"` records every transition"
        );
    }
}

/// What the key's record tells of its attempt, in one line; `None` without a record.
fn record_line(r: &Value) -> Option<String> {
    r.as_object()?;
    let mut line = format!(
        "record: {}, fence {}, claimed {}",
        cell(&r["state"]),
        cell(&r["fence"]),
        time(&r["created_at_ms"])
    );
    match r["state"].as_str() {
        Some("completed") => line.push_str(&format!(
            ", completed {} (status {})",
            time(&r["completed_at_ms"]),
            cell(&r["status"])
        )),
        Some("unknown") => {
            line.push_str(&format!(", unknown since {}", time(&r["unknown_since_ms"])));
        }
        _ => {}
    }
    Some(line)
}
