//! The dashboard as a person sees it: headless Chromium (driven through `chromedriver`)
//! loads `/ui` from a running gateway, is refused with a wrong token, shows the same figures
//! as the admin API with the right one, settles two unknown records through its buttons,
//! and searches the audit trail. Screenshots go to `$SCREENSHOT_DIR` when it is set (the
//! ones in `docs/` are made this way).

#[path = "../common/mod.rs"]
mod common;
mod webdriver;

use std::time::Duration;

use common::{ADMIN_TOKEN, Gateway, Http, Upstream, ci};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use webdriver::{Driver, Session};

fn config(upstream: &str) -> String {
    common::configs::with_admin(upstream, "memory:", "", "", ROUTES)
}

/// The routes of [`config`]: the ones the dashboard shows.
const ROUTES: &str = r#"
[[routes]]
name = "charge"
method = "POST"
path = "/charge"
namespace = "payments.charge"
timeout = "1s"
upstream_failure = "hold"

[[routes]]
name = "refund"
method = "POST"
path = "/refund"
namespace = "payments.refund"
"#;

struct Admin<'a> {
    gw: &'a Gateway,
    http: Http,
}

impl Admin<'_> {
    async fn get(&self, path: &str) -> common::Reply {
        self.http
            .admin(Method::GET, &self.gw.admin_url(path), "")
            .await
    }

    async fn count(&self, state: &str) -> u64 {
        self.get(&format!("/admin/records?state={state}&limit=1001"))
            .await
            .json()["count"]
            .as_u64()
            .expect("count")
    }

    /// The sum of `idem_requests_total{outcome}` over every route.
    async fn requests(&self, outcome: &str) -> u64 {
        self.requests_labelled(&format!("outcome=\"{outcome}\""))
            .await
    }

    /// The sum of `idem_requests_total` over every route and outcome.
    async fn all_requests(&self) -> u64 {
        self.requests_labelled("").await
    }

    /// The sum of the `idem_requests_total` series whose labels contain `label`.
    async fn requests_labelled(&self, label: &str) -> u64 {
        let text = String::from_utf8_lossy(&self.get("/metrics").await.body).into_owned();
        text.lines()
            .filter(|l| l.starts_with("idem_requests_total{") && l.contains(label))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

/// Waits until the figure `name` on the page reads `want`.
async fn figure_is(page: &Session<'_>, name: &str, want: u64) {
    let want = want.to_string();
    page.wait_for(
        &format!("figure {name} = {want}"),
        "const e = document.querySelector(`[data-figure=\"${arguments[0]}\"]`); \
         return e && e.textContent.replace(/,/g, '') === arguments[1];",
        json!([name, want]),
    )
    .await;
}

async fn save_screenshot(page: &Session<'_>, name: &str) {
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Some(dir) = std::env::var_os("SCREENSHOT_DIR") {
        let path = std::path::Path::new(&dir).join(name);
        std::fs::write(&path, &png).expect("write screenshot");
        eprintln!("screenshot: {}", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_what_the_admin_api_says_and_settles_records() {
    let Some((driver_bin, browser)) = webdriver::installed() else {
        assert!(
            !ci(),
            "chromium and chromium-driver are required (scripts/test.sh installs them)"
        );
        eprintln!("skipped: install chromium and chromium-driver to run the dashboard test");
        return;
    };
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let admin = Admin {
        gw: &gw,
        http: http.clone(),
    };

    // Traffic: executions, replays, a mismatch, a refund, and two charges whose upstream
    // timed out after receiving them (unknown under `hold`).
    for n in 1..=3 {
        let k = format!("order-100{n}");
        let r = http
            .post(
                &gw.url("/charge"),
                Some(&k),
                &format!(r#"{{"amount":{n}00}}"#),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    for _ in 0..2 {
        assert!(
            http.post(&gw.url("/charge"), Some("order-1001"), r#"{"amount":100}"#)
                .await
                .replayed()
        );
    }
    let r = http
        .post(&gw.url("/charge"), Some("order-1002"), r#"{"amount":999}"#)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    http.post(&gw.url("/refund"), Some("refund-77"), r#"{"amount":50}"#)
        .await;
    let slow = |k: &'static str| {
        let (http, url) = (http.clone(), gw.url("/charge?delay_ms=3000"));
        tokio::spawn(async move { http.post(&url, Some(k), r#"{"amount":4200}"#).await })
    };
    let (a, b) = (slow("order-2001"), slow("order-2002"));
    for t in [a, b] {
        assert_eq!(t.await.expect("join").status, StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(admin.count("unknown").await, 2);

    let driver = Driver::start(driver_bin).await;
    let page = driver.session(browser, 1440, 1250).await;
    page.goto(&gw.admin_url("/ui?refresh=1")).await;

    // Without a token the page shows nothing but the sign-in.
    page.wait_until(
        "the sign-in prompt",
        "return document.getElementById('message').textContent.includes('Enter the admin token');",
    )
    .await;
    assert_eq!(
        page.run("return document.getElementById('board').hidden;", json!([]))
            .await,
        Value::Bool(true)
    );
    // A wrong token is refused by the API, and the page says so.
    page.type_into("#token", "not-the-admin-token-0000").await;
    page.click("#connect").await;
    page.wait_until(
        "the refusal",
        "return document.getElementById('message').textContent.includes('refused') \
         && document.getElementById('board').hidden;",
    )
    .await;

    page.type_into("#token", ADMIN_TOKEN).await;
    page.click("#connect").await;
    page.wait_until(
        "the first refresh",
        "return Number(document.body.dataset.loaded || 0) >= 1;",
    )
    .await;
    // More traffic between samples, so the chart has something to draw.
    for round in 0..2 {
        let seen = page
            .run("return Number(document.body.dataset.loaded);", json!([]))
            .await
            .as_u64()
            .unwrap_or(0);
        for n in 0..(4 + 3 * round) {
            let k = format!("order-3{round}{n:02}");
            http.post(&gw.url("/charge"), Some(&k), r#"{"amount":10}"#)
                .await;
            http.post(&gw.url("/charge"), Some(&k), r#"{"amount":10}"#)
                .await;
        }
        page.wait_for(
            "the next refresh",
            "return Number(document.body.dataset.loaded) > arguments[0] + 1;",
            json!([seen]),
        )
        .await;
    }
    // A refresh of the record counts, then every figure must read what the API says.
    page.click("#stuckform button").await;
    for state in ["processing", "completed", "unknown"] {
        figure_is(&page, &format!("records-{state}"), admin.count(state).await).await;
    }
    for outcome in ["executed", "replayed", "mismatch", "unknown"] {
        figure_is(
            &page,
            &format!("outcome-{outcome}"),
            admin.requests(outcome).await,
        )
        .await;
    }
    figure_is(&page, "requests-total", admin.all_requests().await).await;
    figure_is(&page, "cards-unknown", 2).await;
    assert_eq!(admin.count("unknown").await, 2);
    let rows = page
        .run(
            "return [...document.querySelectorAll('#stuck tr')].map(r => r.dataset.key).sort();",
            json!([]),
        )
        .await;
    assert_eq!(rows, json!(["order-2001", "order-2002"]));
    save_screenshot(&page, "dashboard.png").await;

    // Settle order-2001 as done: the upstream did charge it, with this answer.
    page.click("tr[data-key='order-2001'] .complete").await;
    page.type_into("tr[data-key='order-2001'] .status", "201")
        .await;
    page.type_into(
        "tr[data-key='order-2001'] .body",
        r#"{"id":"ch_manual_2001","amount":4200}"#,
    )
    .await;
    save_screenshot(&page, "dashboard-settle.png").await;
    page.click("tr[data-key='order-2001'] .save").await;
    page.wait_until(
        "order-2001 to leave the list",
        "return !document.querySelector(\"tr[data-key='order-2001']\");",
    )
    .await;
    let record = admin
        .get("/admin/record?namespace=payments.charge&key=order-2001")
        .await
        .json();
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["response"]["status"], 201);
    // The same request as the one that timed out (its query is part of the fingerprint).
    let retry = http
        .post(
            &gw.url("/charge?delay_ms=3000"),
            Some("order-2001"),
            r#"{"amount":4200}"#,
        )
        .await;
    assert!(
        retry.replayed(),
        "a retry gets the settled answer: {retry:?}"
    );
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.json()["id"], "ch_manual_2001");

    // Release order-2002: it never happened; a retry runs it. Release asks for a second click.
    page.click("tr[data-key='order-2002'] .release").await;
    assert_eq!(
        page.text("tr[data-key='order-2002'] .release")
            .await
            .as_deref(),
        Some("Confirm release")
    );
    assert_eq!(admin.count("unknown").await, 1, "one click settles nothing");
    page.click("tr[data-key='order-2002'] .release").await;
    page.wait_until(
        "order-2002 to leave the list",
        "return !document.querySelector(\"tr[data-key='order-2002']\");",
    )
    .await;
    let gone = admin
        .get("/admin/record?namespace=payments.charge&key=order-2002")
        .await;
    assert_eq!(
        gone.status,
        StatusCode::NOT_FOUND,
        "released: the key is free"
    );
    let before = up.seen.count("/charge");
    let rerun = http
        .post(&gw.url("/charge"), Some("order-2002"), r#"{"amount":4200}"#)
        .await;
    assert_eq!(rerun.status, StatusCode::CREATED);
    assert!(!rerun.replayed());
    assert_eq!(up.seen.count("/charge"), before + 1, "the retry ran");
    figure_is(&page, "records-unknown", 0).await;

    // Audit search by key shows what the admin API has for it.
    page.type_into("#auditkey", "order-2001").await;
    page.click("#auditform button").await;
    let api = admin.get("/admin/audit?key=order-2001").await;
    if api.status == StatusCode::OK {
        let events = api.json()["events"].as_array().map_or(0, Vec::len);
        assert!(events > 0, "the trail of a settled key is not empty");
        page.wait_for(
            "the audit rows",
            "return document.getElementById('auditnote').dataset.count === String(arguments[0]) \
             && document.querySelectorAll('#audit tr').length === arguments[0];",
            json!([events]),
        )
        .await;
        // At the default level the note says the trail holds operator events only.
        assert_eq!(api.json()["level"], "operator");
        page.wait_until(
            "the note on the audit level",
            "return document.getElementById('auditnote').textContent.includes('operator events only');",
        )
        .await;
        page.run(
            "document.getElementById('audittable').scrollIntoView({block: 'end'});",
            json!([]),
        )
        .await;
        save_screenshot(&page, "dashboard-audit.png").await;
    } else {
        assert_eq!(api.status, StatusCode::NOT_FOUND);
        page.wait_until(
            "the note that there is no audit endpoint",
            "return document.getElementById('auditnote').textContent.includes('no audit trail endpoint');",
        )
        .await;
    }

    // Signing out forgets the token.
    page.click("#signout").await;
    assert_eq!(
        page.run(
            "return sessionStorage.getItem('idem.admin-token');",
            json!([])
        )
        .await,
        Value::Null
    );
    page.close().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}
