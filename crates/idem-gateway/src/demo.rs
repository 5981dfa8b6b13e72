//! The built-in sample upstream: a charge endpoint that counts its executions, so the
//! gateway's behaviour shows with curl.
//!
//! - `POST /charge`: 201 with `{"id", "amount", "currency", "executions"}`; `executions` counts
//!   every charge this upstream ever ran. `?delay_ms=N` or a `"delay_ms"` body member keeps
//!   the request in flight for N ms (at most 60 s); `?status=N` answers with status N instead.
//! - `POST /orders/{id}/pay`: 201 with `{"payment", "order", "amount", "executions"}`; the
//!   demo gateway keys it by the order (`{path.id}:pay`) unless the client sends its own key,
//!   so paying one order twice pays once.
//! - `GET /stats`: `{"executions": N}`.
//! - anything else: 200 with the method, path and execution count.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Counts the charges the demo upstream ran.
#[derive(Debug, Default)]
pub struct Demo {
    executions: AtomicU64,
}

impl Demo {
    /// How many charges ran.
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let query = parts.uri.query().unwrap_or("");
        let param = |name: &str| {
            query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_owned())
        };
        let bytes = match Limited::new(body, 1 << 20).collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => {
                return json_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &json!({"error": "body too large"}),
                );
            }
        };
        let doc: Value = if bytes.is_empty() {
            json!({})
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        match (&parts.method, parts.uri.path()) {
            (&Method::POST, "/charge") => {
                if doc.is_null() {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &json!({"error": "body must be JSON"}),
                    );
                }
                let delay = param("delay_ms")
                    .and_then(|v| v.parse::<u64>().ok())
                    .or_else(|| doc.get("delay_ms").and_then(Value::as_u64))
                    .unwrap_or(0)
                    .min(60_000);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let n = self.executions.fetch_add(1, Ordering::Relaxed) + 1;
                let status = param("status")
                    .and_then(|s| s.parse::<u16>().ok())
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .unwrap_or(StatusCode::CREATED);
                let amount = doc.get("amount").cloned().unwrap_or(json!(0));
                let currency = doc.get("currency").cloned().unwrap_or(json!("eur"));
                let body = if status.is_success() {
                    json!({"id": format!("ch_{n:06}"), "amount": amount, "currency": currency, "executions": n})
                } else {
                    json!({"error": format!("charge failed with {}", status.as_u16()), "executions": n})
                };
                json_response(status, &body)
            }
            (&Method::POST, path) if order_to_pay(path).is_some() => {
                let order = order_to_pay(path).unwrap_or_default().to_owned();
                let n = self.executions.fetch_add(1, Ordering::Relaxed) + 1;
                let amount = doc.get("amount").cloned().unwrap_or(json!(0));
                json_response(
                    StatusCode::CREATED,
                    &json!({"payment": format!("pay_{n:06}"), "order": order, "amount": amount, "executions": n}),
                )
            }
            (&Method::GET, "/stats") => {
                json_response(StatusCode::OK, &json!({"executions": self.executions()}))
            }
            (method, path) => json_response(
                StatusCode::OK,
                &json!({"method": method.as_str(), "path": path, "executions": self.executions()}),
            ),
        }
    }
}

/// The order id of `/orders/{id}/pay`.
fn order_to_pay(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/orders/")?.strip_suffix("/pay")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// Where `idem demo` serves the status endpoint.
pub const STATUS_PATH: &str = "/idem/status";

/// The demo gateway's routes: paying an order is keyed by the order itself (a business key)
/// unless the client sends a key; everything else by the client's `Idempotency-Key`.
pub fn routes() -> Vec<crate::config::RawRoute> {
    use crate::config::{Methods, RawKey, RawKeySource, RawRoute};
    vec![
        RawRoute {
            name: Some("pay".into()),
            method: Some(Methods::One("POST".into())),
            path: Some("/orders/{id}/pay".into()),
            key: Some(RawKey::Many(vec![
                RawKeySource {
                    from: Some("header".into()),
                    ..RawKeySource::default()
                },
                RawKeySource {
                    template: Some("{path.id}:pay".into()),
                    ..RawKeySource::default()
                },
            ])),
            ..RawRoute::default()
        },
        RawRoute {
            name: Some("default".into()),
            path: Some("/*".into()),
            ..RawRoute::default()
        },
    ]
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// Serves the demo upstream on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, demo: Arc<Demo>) {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "demo upstream: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let demo = Arc::clone(&demo);
        let svc = hyper::service::service_fn(move |req| {
            let demo = Arc::clone(&demo);
            async move { Ok::<_, Infallible>(demo.handle(req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// Binds `addr` and serves the demo upstream in the background; returns the bound address.
///
/// # Errors
/// The address cannot be bound.
pub async fn spawn(addr: SocketAddr) -> anyhow::Result<(SocketAddr, Arc<Demo>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("demo upstream: cannot bind {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let demo = Arc::new(Demo::default());
    tokio::spawn(serve(listener, Arc::clone(&demo)));
    Ok((bound, demo))
}
