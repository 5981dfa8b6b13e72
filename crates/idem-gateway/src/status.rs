//! The gateway's status endpoint: `GET <status.path>/{key}` tells a caller what became of its
//! key (absent, processing, completed, unknown), and with `?answer=1` returns a completed
//! key's stored answer, so a client that timed out can ask before it retries.
//!
//! A key is looked up exactly as the route that protects it stores it: the route's namespace
//! and the principal its principal source finds in this request (the same headers, the same
//! JWT checks). `?route=NAME` or `?namespace=NS` picks the route; with one protected route
//! neither is needed. The answers themselves are idem-http's [`IdempotencyStatus`].
//!
//! A token route's record key is a one-way digest of the token, which its client does not
//! know, so for such a route the client asks with the token instead: `GET <status.path>` (no
//! key segment) with the token in the route's token header. The endpoint computes the record
//! key the route uses and answers as for any key, in the caller's scope. The token is taken
//! from the header only, never from the URL (URLs end up in logs), and is never echoed.
//!
//! Requests under the path are always answered here and never forwarded, whatever their
//! method or spelling: a spelling other than the configured one is refused, not proxied.

use std::borrow::Cow;

use bytes::Bytes;
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{HeaderName, Request, Response, Uri};
use http_body_util::Empty;
use idem_core::{Engine, Outcome, Refusal};
use idem_http::{IdempotencyStatus, Problem, Reason};
use tower::ServiceExt as _;

use crate::body::{self, ResBody};
use crate::config::{Route, StatusSettings};
use crate::path::{self, TrailingSlash};
use crate::protect::layer_config;
use crate::shared::GatewayStore;
use crate::tokens::{Presented, presented, record_key};

/// The status endpoint of one configuration.
pub(crate) struct StatusEndpoint {
    prefix: String,
    routes: Vec<StatusRoute>,
}

struct StatusRoute {
    name: String,
    namespace: String,
    /// The token header, for a route in token mode.
    token: Option<HeaderName>,
    service: IdempotencyStatus<GatewayStore>,
}

impl std::fmt::Debug for StatusEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.routes.iter().map(|r| r.name.as_str()).collect();
        f.debug_struct("StatusEndpoint")
            .field("prefix", &self.prefix)
            .field("routes", &names)
            .finish()
    }
}

impl StatusEndpoint {
    /// The endpoint at `settings.path` for the protected ones among `routes`.
    ///
    /// # Errors
    /// A route policy the layer refuses (already refused when the configuration compiled).
    pub(crate) fn new(
        settings: &StatusSettings,
        routes: &[Route],
        engine: &Engine<GatewayStore>,
    ) -> anyhow::Result<Self> {
        let mut list = Vec::new();
        for route in routes.iter().filter(|r| r.policy.idempotency) {
            let config = layer_config(&route.policy)?;
            list.push(StatusRoute {
                name: route.name.clone(),
                namespace: route.policy.namespace.clone(),
                token: route.policy.token.as_ref().map(|t| t.header.clone()),
                service: IdempotencyStatus::new(engine, config, &settings.path),
            });
        }
        Ok(Self {
            prefix: settings.path.clone(),
            routes: list,
        })
    }

    /// Whether a request for `raw` (the path as sent) belongs to the endpoint: the path as
    /// sent, or its normalised spelling in any letter case, is the endpoint's path or below.
    pub(crate) fn owns(&self, raw: &str, trailing: TrailingSlash) -> bool {
        if under(raw, &self.prefix, false) {
            return true;
        }
        match path::normalize(raw, trailing) {
            Ok(normal) => under(&normal, &self.prefix, true),
            Err(_) => false,
        }
    }

    /// Answers one status request.
    pub(crate) async fn answer(&self, mut parts: Parts) -> Response<ResBody> {
        if has_param(parts.uri.query(), "token") {
            return refused(
                Reason::StatusToken,
                "send the token in the route's token header, never in the URL (URLs are kept in logs and histories)",
                Refusal::BadTarget,
            );
        }
        let after = parts.uri.path().strip_prefix(self.prefix.as_str());
        let key = after
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|r| !r.is_empty() && !r.contains('/'));
        // The bare path asks with a token, if one of a token route's headers is present.
        let bare = matches!(after, Some("" | "/"))
            && self.routes.iter().any(|r| {
                r.token
                    .as_ref()
                    .is_some_and(|h| parts.headers.contains_key(h))
            });
        if !key && !bare {
            return self.path_refused(None);
        }
        let route = match self.pick(parts.uri.query()) {
            Ok(route) => route,
            Err(detail) => {
                return refused(Reason::StatusRoute, detail, Refusal::NoRoute);
            }
        };
        let token = route
            .token
            .as_ref()
            .filter(|h| parts.headers.contains_key(*h));
        let by_token = match (key, token) {
            (true, None) => false,
            (false, Some(header)) => {
                let Some(uri) = self.record_uri(&parts, header) else {
                    return refused(
                        Reason::StatusToken,
                        format!(
                            "`{header}` must hold exactly one token of 64 lowercase hex digits, as the route's issue path gave it"
                        ),
                        Refusal::BadTarget,
                    );
                };
                // The status service needs the record key only; the token goes no further.
                parts.headers.remove(header);
                parts.uri = uri;
                true
            }
            (true, Some(header)) => return self.path_refused(Some(header)),
            (false, None) => return self.path_refused(None),
        };
        let req = Request::from_parts(parts, Empty::<Bytes>::new());
        let mut res = match route.service.clone().oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        if by_token {
            // A stored answer is replayed as the token route replays it: no key echoed.
            res.headers_mut().remove("idempotency-key");
        }
        body::boxed(res)
    }

    /// The URI asking for the record key of the token in `header` (`<prefix>/tok-…`, the
    /// query kept); `None` if the header does not hold exactly one well-formed token.
    fn record_uri(&self, parts: &Parts, header: &HeaderName) -> Option<Uri> {
        let Presented::Token(token) = presented(&parts.headers, header) else {
            return None;
        };
        let key = record_key(&token)?;
        let path = match parts.uri.query() {
            Some(q) => format!("{}/{key}?{q}", self.prefix),
            None => format!("{}/{key}", self.prefix),
        };
        PathAndQuery::try_from(path).ok().map(Uri::from)
    }

    /// The refusal of a path that names no key (or a key and, in `both`, a token too).
    fn path_refused(&self, both: Option<&HeaderName>) -> Response<ResBody> {
        let detail = match both {
            Some(h) => format!(
                "ask with a key in the path or with the token in `{h}`, not both: GET {}?route=NAME with the token asks about a token route's request",
                self.prefix
            ),
            None if self.routes.iter().any(|r| r.token.is_some()) => format!(
                "ask for a key as GET {p}/{{key}}, with the key percent-encoded as one path segment, or about a token route's request as GET {p}?route=NAME with the token in the route's token header",
                p = self.prefix
            ),
            None => format!(
                "ask for a key as GET {}/{{key}}, with the key percent-encoded as one path segment",
                self.prefix
            ),
        };
        refused(Reason::StatusPath, detail, Refusal::BadTarget)
    }

    /// The route a query names (`route=` or `namespace=`), or the only protected one.
    fn pick(&self, query: Option<&str>) -> Result<&StatusRoute, String> {
        let mut by_name = None;
        let mut by_namespace = None;
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*k {
                "route" => by_name = Some(v),
                "namespace" => by_namespace = Some(v),
                _ => {}
            }
        }
        let names = || {
            let names: Vec<&str> = self.routes.iter().map(|r| r.name.as_str()).collect();
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        };
        match (by_name, by_namespace) {
            (Some(name), None) => self.routes.iter().find(|r| r.name == *name).ok_or_else(|| {
                format!(
                    "no protected route is named `{name}`; the protected routes are: {}",
                    names()
                )
            }),
            (None, Some(ns)) => {
                let mut found = self.routes.iter().filter(|r| r.namespace == *ns);
                match (found.next(), found.next()) {
                    (Some(route), None) => Ok(route),
                    (None, _) => Err(format!("no protected route uses the namespace `{ns}`")),
                    (Some(_), Some(_)) => Err(format!(
                        "several routes use the namespace `{ns}`, each with its own principal source; name one with ?route= ({})",
                        names()
                    )),
                }
            }
            (Some(_), Some(_)) => Err("give `route` or `namespace`, not both".to_owned()),
            (None, None) => match self.routes.as_slice() {
                [only] => Ok(only),
                _ => Err(format!(
                    "name the route whose key this is with ?route= (one of: {})",
                    names()
                )),
            },
        }
    }
}

/// Whether `query` holds the parameter `name`.
fn has_param(query: Option<&str>, name: &str) -> bool {
    query.is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == name))
}

/// Whether `path` is `prefix` or below it.
fn under(path: &str, prefix: &str, ignore_case: bool) -> bool {
    let Some(head) = path.get(..prefix.len()) else {
        return false;
    };
    let same = if ignore_case {
        head.eq_ignore_ascii_case(prefix)
    } else {
        head == prefix
    };
    same && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/'))
}

#[cold]
fn refused(
    reason: Reason,
    detail: impl Into<Cow<'static, str>>,
    why: Refusal,
) -> Response<ResBody> {
    let mut res = body::problem(Problem::new(reason, detail.into().into_owned()));
    res.extensions_mut().insert(Outcome::Refused(why));
    body::boxed(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_owns_every_spelling_of_its_path() {
        let at = |p: &str| under(p, "/idem/status", false);
        assert!(at("/idem/status"));
        assert!(at("/idem/status/k-1"));
        assert!(!at("/idem/statusx"));
        assert!(!at("/idem"));
        let any_case = |p: &str| under(p, "/idem/status", true);
        assert!(any_case("/IDEM/Status/k"));
        assert!(!any_case("/idem/stat"));
    }
}
