//! `idem request`: a curl-like call through idem-client, with one idempotency key and safe
//! retries; after an ambiguous failure it asks the gateway's status endpoint (`--status`)
//! instead of retrying blind.
//!
//! ```text
//! idem request -X POST http://127.0.0.1:8080/charge -d '{"amount": 100}' \
//!     --status http://127.0.0.1:8080/idem/status --key order-42
//! ```
//!
//! The answer's body goes to stdout (with `-i`, the status line and headers first); a summary
//! line (key, attempts, status, whether it was a replay) goes to stderr. Exit codes: 0 with an
//! answer of any status (22 with `--fail` when it is 400 or above), 2 for bad input, 3 when the
//! key's outcome is unknown, 4 when the client gave up or cannot tell what happened.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Args;
use http::Method;
use idem_client::{Call, ClientError, HttpClient, RetryPolicy, StatusEndpoint};

use crate::config::Dur;

/// The arguments of `idem request`.
#[derive(Debug, Clone, Args)]
pub struct RequestArgs {
    /// The URL to call.
    pub url: String,
    /// The method.
    #[arg(short = 'X', long, default_value = "POST")]
    pub method: String,
    /// A header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The body; `@FILE` reads it from a file.
    #[arg(short = 'd', long)]
    pub data: Option<String>,
    /// The idempotency key [default: a new UUID v7].
    #[arg(long)]
    pub key: Option<String>,
    /// The gateway's status endpoint, e.g. http://127.0.0.1:8080/idem/status; without it an
    /// ambiguous failure ends the call (exit 4).
    #[arg(long)]
    pub status: Option<String>,
    /// The gateway route the key belongs to, for the status query.
    #[arg(long)]
    pub route: Option<String>,
    /// Most requests sent.
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// Overall deadline.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub deadline: Dur,
    /// Longest one attempt may take.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub attempt_timeout: Dur,
    /// First backoff cap (doubles per retry, full jitter).
    #[arg(long, default_value = "100ms", value_parser = duration)]
    pub initial_backoff: Dur,
    /// Largest backoff cap.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub max_backoff: Dur,
    /// Print the status line and headers before the body.
    #[arg(short = 'i', long)]
    pub include: bool,
    /// Exit 22 when the answer's status is 400 or above.
    #[arg(long)]
    pub fail: bool,
    /// Log every attempt and status query to stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

fn duration(text: &str) -> Result<Dur, String> {
    Dur::parse(text)
}

/// Runs `idem request`.
pub fn run(args: &RequestArgs) -> ExitCode {
    if args.verbose {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("idem_client=info"))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let (client, call) = match prepare(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(client.send(call)) {
        Ok(reply) => {
            let mut out = std::io::stdout().lock();
            if args.include {
                let _ = writeln!(out, "HTTP {}", reply.status);
                for (name, value) in &reply.headers {
                    let _ = writeln!(out, "{name}: {}", String::from_utf8_lossy(value.as_bytes()));
                }
                let _ = writeln!(out);
            }
            let _ = out.write_all(&reply.body);
            let _ = out.flush();
            eprintln!(
                "idem: key {} · {} attempt{} · status {}{}{} · request id {}",
                reply.key,
                reply.attempts,
                if reply.attempts == 1 { "" } else { "s" },
                reply.status.as_u16(),
                if reply.replayed() { " · replayed" } else { "" },
                if reply.from_status {
                    " · answer fetched from the status endpoint"
                } else {
                    ""
                },
                reply.request_id
            );
            if args.fail && reply.status.as_u16() >= 400 {
                ExitCode::from(22)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                ClientError::Invalid(_) => ExitCode::from(2),
                ClientError::OutcomeUnknown { .. } => ExitCode::from(3),
                _ => ExitCode::from(4),
            }
        }
    }
}

fn prepare(args: &RequestArgs) -> Result<(HttpClient, Call), String> {
    let method = Method::from_bytes(args.method.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("`{}` is not an HTTP method", args.method))?;
    // Like curl, a URL without a scheme is plain http.
    let url = if args.url.contains("://") {
        args.url.clone()
    } else {
        format!("http://{}", args.url)
    };
    let mut call = Call::new(method, &url).map_err(|e| e.to_string())?;
    for h in &args.headers {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| format!("header `{h}` is not `Name: value`"))?;
        call = call
            .header(name.trim(), value.trim())
            .map_err(|e| e.to_string())?;
    }
    if let Some(data) = &args.data {
        let body = match data.strip_prefix('@') {
            Some(path) => std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?,
            None => data.clone().into_bytes(),
        };
        let has_type = args.headers.iter().any(|h| {
            h.split_once(':')
                .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case("content-type"))
        });
        call = if has_type {
            call.body(body)
        } else {
            call.json(body)
        };
    }
    if let Some(key) = &args.key {
        call = call.key(key.clone());
    }
    if let Some(route) = &args.route {
        call = call.route(route.clone());
    }
    let policy = RetryPolicy::default()
        .max_attempts(args.max_attempts)
        .deadline(args.deadline.0)
        .attempt_timeout(args.attempt_timeout.0)
        .initial_backoff(args.initial_backoff.0)
        .max_backoff(args.max_backoff.0);
    let mut client = HttpClient::new(policy).map_err(|e| e.to_string())?;
    if let Some(url) = &args.status {
        let url = if url.contains("://") {
            url.clone()
        } else {
            format!("http://{url}")
        };
        client = client.status_endpoint(StatusEndpoint::new(&url).map_err(|e| e.to_string())?);
    }
    Ok((client, call))
}
