//! OTLP export (feature `otlp`): a gateway configured with `[otel] endpoint` sends each
//! request's span to a collector. The collector here is a small OTLP/gRPC receiver on
//! loopback that decodes what it is sent and keeps the spans.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, Http, Upstream, key};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_core::{Key, Scope, ScopedKey};
use parking_lot::Mutex;
use tokio::net::TcpListener;

/// One exported span: its name, kind and attributes (values rendered as text).
#[derive(Debug, Clone)]
struct Span {
    trace_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    name: String,
    kind: u64,
    attributes: Vec<(String, String)>,
}

impl Span {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    services: Vec<String>,
    exports: usize,
}

/// A protobuf field: its number and its value.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The fields of one protobuf message, in order.
fn fields(mut buf: &[u8]) -> Vec<(u64, Wire<'_>)> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let Some(tag) = varint(&mut buf) else { break };
        let wire = match tag & 7 {
            0 => match varint(&mut buf) {
                Some(v) => Wire::Varint(v),
                None => break,
            },
            1 | 5 => {
                let n = if tag & 7 == 1 { 8 } else { 4 };
                if buf.len() < n {
                    break;
                }
                buf = &buf[n..];
                Wire::Fixed
            }
            2 => {
                let Some(len) = varint(&mut buf).and_then(|l| usize::try_from(l).ok()) else {
                    break;
                };
                if buf.len() < len {
                    break;
                }
                let (value, rest) = buf.split_at(len);
                buf = rest;
                Wire::Bytes(value)
            }
            _ => break,
        };
        out.push((tag >> 3, wire));
    }
    out
}

fn submessages(buf: &[u8], field: u64) -> Vec<&[u8]> {
    fields(buf)
        .into_iter()
        .filter_map(|(n, w)| match w {
            Wire::Bytes(b) if n == field => Some(b),
            _ => None,
        })
        .collect()
}

fn text(buf: &[u8], field: u64) -> Option<String> {
    submessages(buf, field)
        .first()
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

/// `KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue { string = 1; bool = 2; int = 3 }`.
fn key_value(kv: &[u8]) -> Option<(String, String)> {
    let key = text(kv, 1)?;
    let value = submessages(kv, 2).first().copied()?;
    let rendered = fields(value).into_iter().find_map(|(n, w)| match (n, w) {
        (1, Wire::Bytes(s)) => Some(String::from_utf8_lossy(s).into_owned()),
        (2 | 3, Wire::Varint(v)) => Some(v.to_string()),
        _ => None,
    })?;
    Some((key, rendered))
}

/// Reads an `ExportTraceServiceRequest`: resource spans (1) → resource (1) attributes (1),
/// scope spans (2) → spans (2) → name (5), kind (6), attributes (9).
fn read_export(msg: &[u8], into: &mut Received) {
    into.exports += 1;
    for resource_spans in submessages(msg, 1) {
        for resource in submessages(resource_spans, 1) {
            for kv in submessages(resource, 1) {
                if let Some((k, v)) = key_value(kv)
                    && k == "service.name"
                {
                    into.services.push(v);
                }
            }
        }
        for scope_spans in submessages(resource_spans, 2) {
            for span in submessages(scope_spans, 2) {
                let kind = fields(span)
                    .into_iter()
                    .find_map(|(n, w)| match (n, w) {
                        (6, Wire::Varint(v)) => Some(v),
                        _ => None,
                    })
                    .unwrap_or(0);
                let bytes = |field| {
                    submessages(span, field)
                        .first()
                        .map_or(Vec::new(), |b| b.to_vec())
                };
                into.spans.push(Span {
                    trace_id: bytes(1),
                    parent_span_id: bytes(4),
                    name: text(span, 5).unwrap_or_default(),
                    kind,
                    attributes: submessages(span, 9)
                        .into_iter()
                        .filter_map(key_value)
                        .collect(),
                });
            }
        }
    }
}

/// An OTLP/gRPC trace receiver (HTTP/2 without TLS) on a loopback port.
async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let received = Arc::new(Mutex::new(Received::default()));
    let shared = Arc::clone(&received);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let shared = Arc::clone(&shared);
                    async move { Ok::<_, Infallible>(export(req, &shared).await) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), received)
}

type GrpcBody =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

async fn export(req: Request<Incoming>, into: &Mutex<Received>) -> Response<GrpcBody> {
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let status = if path == "/opentelemetry.proto.collector.trace.v1.TraceService/Export" {
        // gRPC framing: a compressed flag, a 4-byte length, the message.
        let mut rest = &body[..];
        while rest.len() >= 5 {
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            let Some(msg) = rest.get(5..5 + len) else {
                break;
            };
            read_export(msg, &mut into.lock());
            rest = &rest[5 + len..];
        }
        "0"
    } else {
        "12" // UNIMPLEMENTED
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    // An empty `ExportTraceServiceResponse`.
    let frames = vec![
        Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
        Ok(Frame::trailers(trailers)),
    ];
    let mut res = Response::new(StreamBody::new(futures::stream::iter(frames)));
    *res.status_mut() = StatusCode::OK;
    res.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    res
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_reach_an_otlp_collector() {
    let (endpoint, received) = receiver().await;
    let up = Upstream::start().await;
    let config = common::configs::anonymous(
        &up.url(),
        "memory:",
        "",
        r#"namespace = "otlp""#,
        &format!(
            r#"
[otel]
endpoint = "{endpoint}"
service_name = "idem-otlp-test"
[[routes]]
name = "charge"
method = "POST"
path = "/charge"
"#
        ),
    );
    let mut gw = Gateway::start(&config, &[]);
    let http = Http::new();
    let k = key();
    let first = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    assert!(again.replayed());
    let missing = http.send(Method::POST, &gw.url("/charge"), &[], "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    // A caller's W3C trace context: the gateway's span joins that trace under that span.
    let traced = http
        .send(
            Method::POST,
            &gw.url("/charge"),
            &[
                ("idempotency-key", &key()),
                (
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            ],
            "{}",
        )
        .await;
    assert_eq!(traced.status, StatusCode::CREATED);

    // Spans are batched; shutting down exports what is left.
    gw.term();
    assert!(gw.wait_exit(Duration::from_secs(10)).await, "{}", gw.logs());

    let got = received.lock();
    assert!(got.exports >= 1, "nothing was exported:\n{}", gw.logs());
    assert!(
        got.services.iter().all(|s| s == "idem-otlp-test") && !got.services.is_empty(),
        "{:?}",
        got.services
    );
    let requests: Vec<&Span> = got
        .spans
        .iter()
        .filter(|s| s.attr("outcome").is_some())
        .collect();
    assert_eq!(requests.len(), 4, "one span per request: {:?}", got.spans);
    let child: Vec<&&Span> = requests
        .iter()
        .filter(|s| !s.parent_span_id.is_empty())
        .collect();
    assert_eq!(
        child.len(),
        1,
        "only the traced request has a parent: {requests:?}"
    );
    assert_eq!(
        hex::encode(&child[0].trace_id),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(hex::encode(&child[0].parent_span_id), "00f067aa0ba902b7");
    let digest = ScopedKey::new(
        Scope::new("otlp").expect("namespace"),
        Key::new(k.clone()).expect("key"),
    )
    .digest_hex();
    let by_outcome = |o: &str| {
        requests
            .iter()
            .find(|s| s.attr("outcome") == Some(o))
            .unwrap_or_else(|| panic!("no {o} span: {requests:?}"))
    };
    let executed = requests
        .iter()
        .find(|s| s.attr("outcome") == Some("executed") && s.parent_span_id.is_empty())
        .expect("the untraced first request");
    assert_eq!(executed.name, "request");
    assert_eq!(executed.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(executed.attr("route"), Some("charge"));
    assert_eq!(executed.attr("status"), Some("201"));
    assert_eq!(executed.attr("idem.key"), Some(digest.as_str()));
    assert_eq!(executed.attr("idem.fence"), Some("1"));
    let replayed = by_outcome("replayed");
    assert_eq!(replayed.attr("idem.key"), Some(digest.as_str()));
    assert_eq!(replayed.attr("idem.fence"), None);
    assert_eq!(by_outcome("refused").attr("status"), Some("400"));
    for span in &got.spans {
        assert!(
            span.attributes.iter().all(|(_, v)| !v.contains(&k)),
            "the key itself is never exported: {span:?}"
        );
    }
}
