//! `idem request` through the real binary: one key, safe retries, and the status query after
//! a lost answer; the exit codes say what happened.

mod common;

use std::process::{Command, Output};

use common::{Gateway, Upstream, bin, key};
use idem_testkit::fault_proxy::Fault;

const CONFIG: &str = r#"
store = "memory:"

[status]
path = "/idem/status"

[defaults]
principal = { from = "header", header = "x-api-key" }

[[routes]]
name = "charge"
method = "POST"
path = "/charge/*"
"#;

/// The test upstream and a gateway in front of it on [`CONFIG`].
async fn start() -> (Upstream, Gateway) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!("upstream = \"{}\"\n{CONFIG}", up.url()), &[]);
    (up, gw)
}

async fn request(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(bin())
            .arg("request")
            .args(&args)
            .output()
            .expect("run idem request")
    })
    .await
    .expect("join")
}

fn args(url: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        url.into(),
        "-H".into(),
        "x-api-key: alice".into(),
        "-d".into(),
        r#"{"amount":100}"#.into(),
        "--initial-backoff".into(),
        "10ms".into(),
    ];
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_fetched_and_a_repeat_is_a_replay() {
    let (up, gw) = start().await;
    let proxy = common::posts_proxy(&gw, [Fault::DropAfterAnswer]).await;
    let url = format!("http://{}/charge/cli", proxy.addr());
    let status = format!("http://{}/idem/status", proxy.addr());
    let k = key();
    let out = request(args(
        &url,
        &["--key", &k, "--status", &status, "--route", "charge"],
    ))
    .await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("\"path\":\"/charge/cli\""), "{stdout}");
    assert!(
        stderr.contains(&format!("key {k}")) && stderr.contains("status endpoint"),
        "{stderr}"
    );
    // The same key again (given as a header this time): the stored answer, byte for byte,
    // and no second charge.
    let header = format!("idempotency-key: {k}");
    let again = request(args(&url, &["-H", &header, "-i"])).await;
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success());
    assert!(text.starts_with("HTTP 201"), "{text}");
    assert!(text.contains("idempotent-replayed: true"), "{text}");
    assert!(text.ends_with(&*stdout), "{text}");
    assert_eq!(up.seen.count("/charge/cli"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_say_what_happened() {
    let (up, gw) = start().await;
    // A lost answer and no status endpoint: the client cannot tell, and says so.
    let proxy = common::posts_proxy(&gw, [Fault::DropAfterAnswer]).await;
    let out = request(args(&format!("http://{}/charge/blind", proxy.addr()), &[])).await;
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("outcome cannot be told"));
    assert_eq!(up.seen.count("/charge/blind"), 1, "not sent again");
    // An unknown outcome (the upstream reset after the request was sent).
    let out = request(args(
        &gw.url("/charge/x/reset"),
        &["--status", &gw.url("/idem/status"), "--route", "charge"],
    ))
    .await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A final 4xx answer is returned as is, and not retried; --fail makes it an exit code.
    let out = request(args(
        &gw.url("/charge/status/422"),
        &["--fail", "--key", &key()],
    ))
    .await;
    assert_eq!(out.status.code(), Some(22));
    assert_eq!(up.seen.count("/charge/status/422"), 1);
    // Bad input.
    let out = request(args("ftp://example.invalid/x", &[])).await;
    assert_eq!(out.status.code(), Some(2));
    let out = request(args(&gw.url("/charge/x"), &["--key", "bad\u{e9}key"])).await;
    assert_eq!(out.status.code(), Some(2));
}
