//! The command line: `check-config` on good and garbage configs, precedence of file,
//! environment and flags, and the demo quick start from docs/gateway.md.

mod common;

use std::process::{Command, Output};

use common::{Gateway, Http, TempDir, bin, key};
use http::{Method, StatusCode};

fn check(config: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = TempDir::new("check");
    let mut cmd = Command::new(bin());
    cmd.arg("check-config").current_dir(&dir.0);
    if let Some(text) = config {
        let path = dir.0.join("idem.toml");
        std::fs::write(&path, text).expect("write");
        cmd.arg("--config").arg(path);
    }
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run idem")
}

/// [`check`] on the file `config` alone: how it exited, its stdout and its stderr.
fn check_file(config: &str) -> (Output, String, String) {
    let out = check(Some(config), &[], &[]);
    let (stdout, stderr) = text(&out);
    (out, stdout, stderr)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

// Guards point 1 of "at most once across crashes by default": a setting that can run a key
// twice under a single fault is opt-in, and `check-config` names the risk on every route that
// chooses it, unless the route says its upstream refuses stale fences.
#[test]
fn check_config_names_what_risks_the_promise() {
    let base = "upstream = \"http://127.0.0.1:9\"\n[defaults]\nprincipal = { from = \"none\" }\n";
    let (defaults, stdout, _) = check_file(&format!(
        "{base}[[routes]]\nname = \"pay\"\npath = \"/pay\"\n"
    ));
    assert!(defaults.status.success(), "{stdout}");
    assert!(
        stdout.contains("expired lease -> Hold"),
        "the default holds: {stdout}"
    );
    assert!(!stdout.contains("risk:"), "{stdout}");
    assert!(stdout.contains("ok: configuration is valid\n"), "{stdout}");

    let (risky, stdout, _) = check_file(&format!(
        "{base}[[routes]]\nname = \"pay\"\npath = \"/pay\"\ntakeover = \"reexecute\"\n\
             [[routes]]\nname = \"refund\"\npath = \"/refund\"\nupstream_failure = \"retry\"\n\
             [[routes]]\nname = \"fenced\"\npath = \"/fenced\"\ntakeover = \"reexecute\"\nfenced_upstream = true\n"
    ));
    assert!(
        risky.status.success(),
        "risks are named, not refused: {stdout}"
    );
    let risks: Vec<&str> = stdout.lines().filter(|l| l.starts_with("risk:")).collect();
    assert_eq!(risks.len(), 2, "{stdout}");
    assert!(risks[0].contains("route `pay`") && risks[0].contains("takeover = \"reexecute\""));
    assert!(risks[0].contains("idempotency-fence"), "{}", risks[0]);
    assert!(
        risks[1].contains("route `refund`") && risks[1].contains("upstream_failure = \"retry\"")
    );
    assert!(
        !stdout.contains("route `fenced`:"),
        "fenced_upstream silences it: {stdout}"
    );
    assert!(stdout.contains("with 2 risk(s)"), "{stdout}");
}

#[test]
fn check_config_explains_a_valid_config() {
    let (out, stdout, stderr) = check_file(
        r#"
upstream = "http://127.0.0.1:3000"
store = "postgres://idem:secret@db:5432/idem"
[admin]
listen = "127.0.0.1:9091"
token = "0123456789abcdef0123"
[[routes]]
name = "charge"
method = "POST"
path = "/v1/charges"
ttl = "1h"
takeover = "hold"
principal = { from = "header", header = "x-api-key" }
fingerprint = { exclude = ["client_time"] }
[[routes]]
method = "GET"
path = "/v1/*"
idempotency = false
"#,
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for needle in [
        "POST /v1/charges [charge]",
        "namespace:   charge",
        "principal:   header x-api-key (a stable credential, stored hashed)",
        "ttl 1h",
        "expired lease -> Hold",
        "idempotency: off (plain proxy)",
        "admin:     127.0.0.1:9091 (bearer token required;",
        "PostgreSQL, shared",
        "ok: configuration is valid",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    assert!(
        !stdout.contains("secret"),
        "passwords and tokens never print:\n{stdout}"
    );
    assert!(
        !stdout.contains("0123456789abcdef0123"),
        "passwords and tokens never print:\n{stdout}"
    );
}

#[test]
fn garbage_configs_get_clear_errors_never_panics() {
    let cases: &[(&str, &str)] = &[
        ("\u{0}\u{1}binary garbage", "invalid configuration"),
        ("[[routes]\npath = ", "invalid configuration"),
        ("routes = 5", "routes"),
        (
            "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\ntakeover = \"reexecute\"\nlease = \"2s\"",
            "lease",
        ),
        (
            "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nttl = \"forever\"",
            "forever",
        ),
        (
            "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nmax_request_body = \"lots\"",
            "lots",
        ),
        (
            "upstream = \"http://x\"\nlisten = \"not-an-address\"",
            "listen",
        ),
        (
            "upstream = \"http://x\"\nstore = \"sqlite:\"",
            "sqlite:PATH",
        ),
        (
            "upstream = \"http://x\"\n[admin]\nlisten = \"127.0.0.1:9\"\ntoken = \"short\"",
            "16 characters",
        ),
        (
            "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nprincipal = { from = \"jwt\", rs256_public_key_file = \"/nonexistent.pem\" }",
            "nonexistent",
        ),
        (
            "upstream = \"http://x\"\n[defaults]\nprincipal = { from = \"none\" }\n[[routes]]\npath = \"/o/{id}\"\nkey = { template = \"{path.order}:pay\" }",
            "path parameter `order`",
        ),
        (
            "upstream = \"http://x\"\n[defaults]\nprincipal = { from = \"none\" }\n[[routes]]\npath = \"/o\"\nkey = { from = \"cookie\" }",
            "cookie",
        ),
    ];
    for (config, needle) in cases {
        let (out, stdout, stderr) = check_file(config);
        assert_eq!(
            out.status.code(),
            Some(2),
            "config {config:?}\n{stdout}\n{stderr}"
        );
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(
            stderr.contains(needle),
            "error for {config:?} should mention {needle:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let missing = Command::new(bin())
        .args(["check-config", "--config", "/nonexistent/idem.toml"])
        .output()
        .expect("run");
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing).1.contains("does not exist"));
}

/// Without `principal`, every caller of a protected route would share one key space: the
/// gateway refuses to start and says what to choose.
#[test]
fn a_config_without_a_principal_is_refused() {
    let (out, stdout, stderr) =
        check_file("upstream = \"http://127.0.0.1:3000\"\n[[routes]]\npath = \"/charge\"");
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    for needle in [
        "must say whose keys they are",
        "from = \"none\"",
        "single-tenant",
        "from = \"header\"",
        "API key",
        "from = \"jwt\"",
        "bearer token is a poor principal",
        "refreshed between two attempts",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    }
    // The same configuration with the choice made explicit is accepted and shown.
    let (out, stdout, stderr) = check_file(
        "upstream = \"http://127.0.0.1:3000\"\n[[routes]]\npath = \"/charge\"\nprincipal = { from = \"none\" }",
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("principal:   none (single tenant"),
        "{stdout}"
    );
}

#[test]
fn flags_beat_environment_beats_file() {
    let file = "upstream = \"http://127.0.0.1:3000\"\nlisten = \"127.0.0.1:1111\"\nstore = \"memory:\"\n[defaults]\nprincipal = { from = \"none\" }";
    let only_file = text(&check(Some(file), &[], &[])).0;
    assert!(
        only_file.contains("listen:    127.0.0.1:1111"),
        "{only_file}"
    );
    let env = [
        ("IDEM_LISTEN", "127.0.0.1:2222"),
        ("IDEM_DEFAULTS__TTL", "2h"),
    ];
    let with_env = text(&check(Some(file), &[], &env)).0;
    assert!(with_env.contains("listen:    127.0.0.1:2222"), "{with_env}");
    assert!(
        with_env.contains("ttl 2h"),
        "nested fields through __: {with_env}"
    );
    assert!(
        with_env.contains("IDEM_LISTEN"),
        "the variables used are named: {with_env}"
    );
    let with_flag = text(&check(Some(file), &["--listen", "127.0.0.1:3333"], &env)).0;
    assert!(
        with_flag.contains("listen:    127.0.0.1:3333"),
        "{with_flag}"
    );
    // A bad value from the environment is reported like any other.
    let bad = check(Some(file), &[], &[("IDEM_DEFAULTS__TTL", "soon")]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).1.contains("soon"));
}

/// The quick start of docs/gateway.md, against `idem demo` on its default SQLite file (in a
/// temporary directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_behaves_as_documented() {
    let dir = TempDir::new("demo");
    let mut cmd = Command::new(bin());
    cmd.args([
        "demo",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "sqlite:./idem.db",
    ])
    .current_dir(&dir.0);
    let gw = Gateway::spawn(cmd);
    let http = Http::new();
    let k = key();
    let first = http
        .post(&gw.url("/charge"), Some(&k), r#"{"amount": 100}"#)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json()["executions"], 1);
    assert_eq!(first.json()["amount"], 100);
    let replay = http
        .post(&gw.url("/charge"), Some(&k), r#"{"amount": 100}"#)
        .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    let mismatch = http
        .post(&gw.url("/charge"), Some(&k), r#"{"amount": 200}"#)
        .await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    // Two identical slow charges at once: one runs, the other is refused while it is in flight.
    let slow = key();
    let send = || {
        let (http, url, slow) = (http.clone(), gw.url("/charge"), slow.clone());
        tokio::spawn(async move {
            http.post(&url, Some(&slow), r#"{"amount": 5, "delay_ms": 1500}"#)
                .await
        })
    };
    let (a, b) = (send(), send());
    let (a, b) = (a.await.expect("join"), b.await.expect("join"));
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::CREATED, StatusCode::CONFLICT]);
    let conflict = if a.status == StatusCode::CONFLICT {
        a
    } else {
        b
    };
    assert_eq!(conflict.problem_type(), "in-flight");
    let stats = http.get(&gw.url("/stats")).await;
    assert_eq!(
        stats.json()["executions"],
        2,
        "one charge each for two keys"
    );
    // Paying an order is keyed by the order itself: twice, with no header, pays once.
    let order = gw.url("/orders/42/pay");
    let pay_order = || http.send(Method::POST, &order, &[], r#"{"amount": 7}"#);
    let pay = pay_order().await;
    assert_eq!(pay.status, StatusCode::CREATED);
    let again = pay_order().await;
    assert!(again.replayed());
    let stats = http.get(&gw.url("/stats")).await;
    assert_eq!(stats.json()["executions"], 3, "the order was paid once");
    // The demo serves the status endpoint: the first charge's key reads completed.
    let status = http
        .get(&gw.url(&format!("/idem/status/{k}?route=default")))
        .await;
    assert_eq!(status.json()["state"], "completed");
    assert!(
        dir.0.join("idem.db").exists(),
        "the demo keeps its records in the SQLite file"
    );
}
