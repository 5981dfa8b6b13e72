//! How the gateway reads a caller's credential, through the real `idem` binary: a JWT's time
//! window, a credential sent twice, and what `check-config` and `serve` say about a JWT
//! principal that checks no audience or issuer.

mod common;

use common::{Gateway, Http, Upstream, key};
use http::{Method, StatusCode};

const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!";

fn config(upstream: &str) -> String {
    format!(
        r#"
upstream = "{upstream}"
store = "memory:"
[status]
path = "/idem/status"
[[routes]]
name = "jwt"
path = "/jwt/*"
principal = {{ from = "jwt", hs256_secret = "{SECRET}", issuer = "test-issuer", audience = "idem" }}
[[routes]]
name = "tenant"
path = "/tenant/*"
principal = {{ from = "header", header = "x-api-key" }}
"#
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn bearer(claims: &serde_json::Value) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("key");
    format!(
        "Bearer {}",
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), claims, &key).expect("encode")
    )
}

fn claims(sub: &str, exp: u64, nbf: Option<u64>) -> serde_json::Value {
    let mut c = serde_json::json!({"sub": sub, "exp": exp, "iss": "test-issuer", "aud": "idem"});
    if let Some(nbf) = nbf {
        c["nbf"] = nbf.into();
    }
    c
}

// Regression: `nbf` was not checked, so a token valid only from later was accepted now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_not_valid_yet_is_refused_like_an_expired_one() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let send = |auth: String| {
        let (http, url) = (http.clone(), gw.url("/jwt/pay"));
        async move {
            http.send(
                Method::POST,
                &url,
                &[("idempotency-key", &key()), ("authorization", &auth)],
                "{}",
            )
            .await
        }
    };
    let t = now();
    let expired = send(bearer(&claims("alice", t - 600, None))).await;
    let later = send(bearer(&claims("alice", t + 1200, Some(t + 600)))).await;
    expired.assert_status(StatusCode::UNAUTHORIZED);
    later.assert_status(StatusCode::UNAUTHORIZED);
    let (e, l) = (expired.json(), later.json());
    for member in ["type", "title", "status"] {
        assert_eq!(e[member], l[member], "{member}: {e} vs {l}");
    }
    assert_eq!(up.seen.total(), 0, "nothing reached the upstream");
    // The same 5 s leeway as `exp`: a clock a little behind the issuer's still agrees.
    let soon = send(bearer(&claims("alice", t + 1200, Some(t + 2)))).await;
    soon.assert_status(StatusCode::CREATED);
}

// Regression: only the first `Authorization` header was verified, and every one was
// forwarded, so an upstream reading the last one acted for whoever that token named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_sent_twice_is_refused_before_anything_runs() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let exp = now() + 600;
    let (alice, bob) = (
        bearer(&claims("alice", exp, None)),
        bearer(&claims("bob", exp, None)),
    );
    let k = key();
    for (path, headers) in [
        (
            "/jwt/pay",
            vec![("authorization", alice.as_str()), ("authorization", "x")],
        ),
        (
            "/jwt/pay",
            vec![("authorization", alice.as_str()), ("authorization", &bob)],
        ),
        (
            "/tenant/pay",
            vec![("x-api-key", "alice-key"), ("x-api-key", "bob-key")],
        ),
    ] {
        let mut all = headers.clone();
        all.push(("idempotency-key", &k));
        let r = http.send(Method::POST, &gw.url(path), &all, "{}").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {:?}", r.body);
        assert_eq!(
            r.problem_type(),
            "credential-ambiguous",
            "{path}: {:?}",
            r.body
        );
        // The status endpoint reads the same principal: refused the same way.
        let route = path.trim_start_matches('/').split('/').next().unwrap_or("");
        let s = http
            .send(
                Method::GET,
                &gw.url(&format!("/idem/status/{k}?route={route}")),
                &headers,
                "",
            )
            .await;
        assert_eq!(s.status, StatusCode::BAD_REQUEST, "{path}: {:?}", s.body);
        assert_eq!(s.problem_type(), "credential-ambiguous", "{:?}", s.body);
    }
    assert_eq!(up.seen.total(), 0, "nothing reached the upstream");
    // One of each is still fine, and the key was never claimed by the refused requests.
    let one = http
        .send(
            Method::POST,
            &gw.url("/jwt/pay"),
            &[("authorization", &alice), ("idempotency-key", &k)],
            "{}",
        )
        .await;
    one.assert_status(StatusCode::CREATED);
    assert!(!one.replayed());
}

fn check(config: &str) -> (bool, String) {
    let out = common::check_config(config);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn jwt_route(name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\npath = \"/{name}\"\n\
         principal = {{ from = \"jwt\", hs256_secret = \"{SECRET}\"{extra} }}\n"
    )
}

// A JWT principal without `audience` (or `issuer`) takes any token its key signed, for any
// service: not refused (existing configs keep working), but named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_principal_checking_no_audience_or_issuer_is_named() {
    let base = "upstream = \"http://127.0.0.1:9\"\nstore = \"memory:\"\n";
    let cfg = format!(
        "{base}{}{}{}{}",
        jwt_route("open", ""),
        jwt_route("no-aud", ", issuer = \"test-issuer\""),
        jwt_route("no-iss", ", audience = \"idem\""),
        jwt_route("both", ", issuer = \"test-issuer\", audience = \"idem\""),
    );
    let (ok, stdout) = check(&cfg);
    assert!(ok, "named, not refused: {stdout}");
    let risks: Vec<&str> = stdout.lines().filter(|l| l.starts_with("risk:")).collect();
    assert_eq!(risks.len(), 3, "{stdout}");
    assert!(
        risks[0].contains("route `open`")
            && risks[0].contains("no `audience` and no `issuer`")
            && risks[0].contains("another service"),
        "{}",
        risks[0]
    );
    assert!(
        risks[1].contains("route `no-aud`") && risks[1].contains("no `audience`"),
        "{}",
        risks[1]
    );
    assert!(
        risks[2].contains("route `no-iss`") && risks[2].contains("no `issuer`"),
        "{}",
        risks[2]
    );
    assert!(!stdout.contains("route `both`:"), "{stdout}");
    assert!(stdout.contains("with 3 risk(s)"), "{stdout}");

    let gw = Gateway::start(&cfg, &[]);
    assert!(
        gw.logged("route `open`: the JWT principal checks no `audience`")
            .await,
        "{}",
        gw.logs()
    );
}
