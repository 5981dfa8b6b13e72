//! `idem admin` through the real binary against a running gateway: tables for people,
//! `--json` for scripts, and exit codes that tell done (0) from failed (1), bad usage (2),
//! not found (3) and refused (4).

mod common;

use std::process::Command;

use common::{ADMIN_TOKEN, Gateway, Http, TempDir, Upstream, bin, key};
use http::StatusCode;
use serde_json::Value;

/// The charge route that holds an upstream failure, on the memory store, audited at `all`.
fn config(upstream: &str) -> String {
    common::configs::with_admin(
        upstream,
        "memory:",
        "",
        r#"namespace = "payments""#,
        CHARGE_ROUTE_AUDITED,
    )
}

/// What follows the head in [`config`]; the first test takes `[audit]` out again.
const CHARGE_ROUTE_AUDITED: &str = r#"
[audit]
level = "all"

[[routes]]
name = "charge"
path = "/charges"
timeout = "1s"
upstream_failure = "hold"
"#;

/// Runs `idem admin --url … ARGS` with `IDEM_ADMIN_TOKEN` set to `token` (unset for `None`);
/// answers the exit code and stdout.
fn admin(gw: &Gateway, token: Option<&str>, args: &[&str]) -> (i32, String) {
    let (code, out, _) = admin_err(gw, token, args);
    (code, out)
}

/// As [`admin`], with stderr too.
fn admin_err(gw: &Gateway, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let url = format!("http://{}", gw.admin.expect("admin listener"));
    let mut cmd = Command::new(bin());
    cmd.arg("admin").args(["--url", &url]).args(args);
    cmd.env_remove("IDEM_ADMIN_TOKEN");
    if let Some(t) = token {
        cmd.env("IDEM_ADMIN_TOKEN", t);
    }
    let out = cmd.output().expect("run idem admin");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// At the default audit level a first request leaves no event: `idem admin audit` prints an
/// empty table, and on stderr the key's record (claimed, completed, status) and a note on
/// the level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_of_a_first_request_shows_its_record() {
    let up = Upstream::start().await;
    let cfg = config(&up.url()).replace("[audit]\nlevel = \"all\"\n", "");
    let gw = Gateway::start(&cfg, &[]);
    let k = key();
    let r = Http::new().post(&gw.url("/charges"), Some(&k), "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let (code, out, err) = admin_err(&gw, Some(ADMIN_TOKEN), &["audit", &k, "-n", "payments"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().count(), 1, "only the header: {out}");
    let record = err
        .lines()
        .find(|l| l.starts_with("record: "))
        .unwrap_or_default();
    assert!(record.starts_with("record: completed, fence "), "{err}");
    assert!(
        record.contains(", claimed 20") && record.ends_with("(status 201)"),
        "{err}"
    );
    assert!(err.contains("note: audit level `operator`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_settles_and_audits_an_unknown_payment() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let k = key();
    let r = http
        .post(&gw.url("/charges?delay_ms=3000"), Some(&k), "{}")
        .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    let t = Some(ADMIN_TOKEN);

    // Finding it: a table, and JSON.
    let (code, table) = admin(&gw, t, &["records", "list", "--state", "unknown"]);
    assert_eq!(code, 0, "{table}");
    assert!(table.starts_with("STATE"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains(&k))
        .expect("row of the key");
    assert!(
        row.starts_with("unknown") && row.contains("payments"),
        "{row}"
    );
    let (code, out) = admin(&gw, t, &["--json", "records", "list", "--state", "unknown"]);
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).expect("json");
    assert!(
        listed["records"]
            .as_array()
            .expect("records")
            .iter()
            .any(|r| r["key"] == k.as_str())
    );
    let (code, shown) = admin(&gw, t, &["records", "get", &k, "-n", "payments"]);
    assert_eq!(code, 0);
    assert!(shown.contains("unknown since"), "{shown}");

    // Not found, refused, bad usage, failed.
    assert_eq!(
        admin(&gw, t, &["records", "get", "nope", "-n", "payments"]).0,
        3
    );
    assert_eq!(
        admin(&gw, Some("wrong-token-wrong-token"), &["records", "list"]).0,
        4
    );
    assert_eq!(admin(&gw, None, &["records", "list"]).0, 2);
    assert_eq!(
        admin(&gw, t, &["records", "resolve", &k, "-n", "payments"]).0,
        2,
        "neither --complete nor --release"
    );
    let (code, _) = {
        let mut cmd = Command::new(bin());
        cmd.args(["admin", "--url", "http://127.0.0.1:9", "records", "list"])
            .env("IDEM_ADMIN_TOKEN", ADMIN_TOKEN);
        let out = cmd.output().expect("run");
        (out.status.code().unwrap_or(-1), ())
    };
    assert_eq!(code, 1, "nothing listens there");

    // Settling it, with the token from a file.
    let dir = TempDir::new("admin-cli");
    let file = dir.0.join("token");
    std::fs::write(&file, format!("{ADMIN_TOKEN}\n")).expect("token file");
    let file = file.display().to_string();
    let (code, out) = admin(
        &gw,
        None,
        &[
            "--token-file",
            &file,
            "--actor",
            "ann",
            "records",
            "resolve",
            &k,
            "-n",
            "payments",
            "--complete",
            "201",
            "--body",
            r#"{"charged":true}"#,
            "--header",
            "content-type: application/json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let replay = http
        .post(&gw.url("/charges?delay_ms=3000"), Some(&k), "{}")
        .await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.json()["charged"], true);
    // A completed record is not resolvable: refused.
    assert_eq!(
        admin(
            &gw,
            t,
            &["records", "resolve", &k, "-n", "payments", "--release"]
        )
        .0,
        4
    );

    // Its trail.
    let (code, trail) = admin(&gw, t, &["audit", &k, "-n", "payments"]);
    assert_eq!(code, 0);
    let events: Vec<&str> = trail
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(events, ["resolved", "unknown", "claimed"], "{trail}");
    assert!(trail.contains("admin:ann"), "{trail}");
    let (code, out) = admin(&gw, t, &["--json", "audit", &k, "-n", "payments"]);
    assert_eq!(code, 0);
    let json: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(json["events"][0]["event"], "resolved");
    assert_eq!(json["events"][0]["status"], 201);

    // Deleting: once found, then not.
    assert_eq!(
        admin(&gw, t, &["records", "delete", &k, "-n", "payments"]).0,
        0
    );
    assert_eq!(
        admin(&gw, t, &["records", "delete", &k, "-n", "payments"]).0,
        3
    );
    assert_eq!(up.seen.count("/charges"), 1);
}

/// An admin listener behind TLS: `idem admin` verifies it against `--ca-file` and refuses it
/// without (the private CA is not among the system roots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_admin_listener_is_reached_with_its_ca_file() {
    let up = Upstream::start().await;
    let dir = TempDir::new("admin-tls");
    let pki = common::pki::issue(&dir.0, "admin");
    let cfg = config(&up.url()).replace(
        &format!("token = \"{ADMIN_TOKEN}\"\n"),
        &format!(
            "token = \"{ADMIN_TOKEN}\"\ntls = {{ cert_file = \"{}\", key_file = \"{}\" }}\n",
            pki.server_cert.display(),
            pki.server_key.display()
        ),
    );
    let gw = Gateway::start(&cfg, &[]);
    let url = format!("https://{}", gw.admin.expect("admin listener"));
    let run = |extra: &[&str]| {
        let out = Command::new(bin())
            .arg("admin")
            .args(["--url", &url])
            .args(extra)
            .args(["records", "list"])
            .env("IDEM_ADMIN_TOKEN", ADMIN_TOKEN)
            .env_remove("IDEM_ADMIN_CA_FILE")
            .output()
            .expect("run idem admin");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let ca = pki.ca_file.display().to_string();
    let (code, out, err) = run(&["--ca-file", &ca]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("STATE"), "{out}");
    let (code, _, err) = run(&[]);
    assert_eq!(code, 1, "an unverifiable listener is a failure: {err}");
    // Plain HTTP to the TLS listener gets no answer either.
    let plain = Command::new(bin())
        .arg("admin")
        .args(["--url", &url.replace("https://", "http://")])
        .args(["--timeout", "2s", "records", "list"])
        .env("IDEM_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .expect("run idem admin");
    assert_eq!(plain.status.code(), Some(1));
    let (code, _, err) = {
        let out = Command::new(bin())
            .arg("admin")
            .args(["--url", "ftp://127.0.0.1:1", "records", "list"])
            .env("IDEM_ADMIN_TOKEN", ADMIN_TOKEN)
            .output()
            .expect("run idem admin");
        (
            out.status.code().unwrap_or(-1),
            (),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("http:// or https://"), "{err}");
}

/// Regression: `idem admin` printed stored strings raw, so an upstream whose stored answer
/// held terminal escapes (`ESC [ 2 J` clears the screen, `ESC ] 0 ; … BEL` retitles it, a
/// bidi override reverses text) repainted the operator's terminal through `records get`.
/// The table shows them as visible escapes; `--json` keeps serde_json's exact escaping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_terminal_escapes_are_shown_not_obeyed() {
    const NASTY: &str = "paid\u{1b}[2J\u{1b}]0;owned\u{7}\r\u{202e}gpj.exe";
    let app = axum::Router::new().route(
        "/charges",
        axum::routing::post(|| async { (axum::http::StatusCode::CREATED, NASTY) }),
    );
    let upstream = format!("http://{}", common::serve_router(app).await);
    let gw = Gateway::start(&config(&upstream), &[]);
    let k = key();
    let r = Http::new().post(&gw.url("/charges"), Some(&k), "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);

    let t = Some(ADMIN_TOKEN);
    let (code, shown) = admin(&gw, t, &["records", "get", &k, "-n", "payments"]);
    assert_eq!(code, 0, "{shown}");
    assert!(
        !shown.contains(['\u{1b}', '\u{7}', '\r', '\u{202e}']),
        "raw terminal controls printed: {shown:?}"
    );
    assert!(
        shown.contains(r"paid\x1b[2J\x1b]0;owned\x07\r\u{202e}gpj.exe"),
        "{shown}"
    );
    let (code, out) = admin(&gw, t, &["--json", "records", "get", &k, "-n", "payments"]);
    assert_eq!(code, 0, "{out}");
    let record: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(record["response"]["body"], NASTY);
}
