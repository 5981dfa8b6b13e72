//! The dashboard at `/ui` on the admin listener: one page, its script and its style sheet,
//! compiled into the binary (no build step, nothing fetched from elsewhere).
//!
//! The page itself holds no data and needs no token. It asks the operator for the admin
//! token, keeps it in the tab's `sessionStorage`, and reads everything through the
//! token-guarded admin API: `/metrics` (requests by outcome over time, store latency,
//! claims held, cache hits), `/admin/records` (records by state, the unknown and stuck
//! list), `/admin/record/resolve` (release or complete a record) and `/admin/audit` (the
//! trail of a key). A content security policy allows only this origin's script and style,
//! and the script sets every value as text, so a key or a stored body cannot inject markup.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// What the page may load and where it may send requests: its own origin only.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; form-action 'none'; base-uri 'none'; \
    frame-ancestors 'none'";

/// `/ui` (and `/ui/`), `/ui/app.js` and `/ui/app.css`; no token needed.
pub(crate) fn router() -> Router {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // A new binary brings new assets; a cached old script must not talk to a new API.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        // No external URL anywhere: nothing is fetched from the network but this gateway.
        for text in [INDEX, SCRIPT, STYLE] {
            assert!(!text.contains("http://") || text.contains("http://www.w3.org/2000/svg"));
            assert!(!text.contains("https://"));
        }
        assert!(INDEX.contains(r#"src="/ui/app.js""#));
        assert!(INDEX.contains(r#"href="/ui/app.css""#));
        // Values go in as text: the script never assigns markup.
        assert!(!SCRIPT.contains("innerHTML"));
        assert!(!SCRIPT.contains("outerHTML"));
        assert!(!SCRIPT.contains("insertAdjacentHTML"));
    }
}
