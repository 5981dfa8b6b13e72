//! Just enough of the W3C WebDriver protocol to drive headless Chromium through
//! `chromedriver`: open a page, run a script, find, click and type, take a screenshot.
#![allow(missing_docs, missing_debug_implementations)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};

use crate::common::{Http, spare_port};

/// The key WebDriver uses for element references.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A `chromedriver` process, killed on drop.
pub(crate) struct Driver {
    child: Child,
    url: String,
    http: Http,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where Debian's `chromium` and `chromium-driver` put their binaries.
pub(crate) fn installed() -> Option<(&'static str, &'static str)> {
    let driver = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let browser = ["/usr/bin/chromium", "/usr/lib/chromium/chromium"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    Some((driver, browser))
}

impl Driver {
    /// Starts `driver` on a spare loopback port and waits until it answers.
    pub(crate) async fn start(driver: &str) -> Self {
        let port = spare_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut this = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: Http::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = this
                .http
                .try_send(Method::GET, &format!("{}/status", this.url), &[], "")
                .await
                && r.json()["value"]["ready"] == true
            {
                return this;
            }
            assert!(Instant::now() < deadline, "chromedriver did not come up");
            if let Ok(Some(status)) = this.child.try_wait() {
                panic!("chromedriver exited: {status}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn call(&self, method: Method, path: &str, body: Value) -> Value {
        let body = if method == Method::GET || method == Method::DELETE {
            String::new()
        } else {
            body.to_string()
        };
        let r = self
            .http
            .send(
                method.clone(),
                &format!("{}{path}", self.url),
                &[("content-type", "application/json")],
                &body,
            )
            .await;
        let v = r.json();
        assert!(
            r.status.is_success(),
            "webdriver {method} {path}: {} {v}",
            r.status
        );
        v["value"].clone()
    }

    /// A new headless browser session with a `width`×`height` window.
    pub(crate) async fn session(&self, browser: &str, width: u32, height: u32) -> Session<'_> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--no-first-run",
                         format!("--window-size={width},{height}")],
            },
        }}});
        let v = self.call(Method::POST, "/session", caps).await;
        let id = v["sessionId"].as_str().expect("session id").to_owned();
        Session { driver: self, id }
    }
}

/// One browser session, closed on [`Session::close`].
pub(crate) struct Session<'a> {
    driver: &'a Driver,
    id: String,
}

impl Session<'_> {
    async fn call(&self, method: Method, path: &str, body: Value) -> Value {
        self.driver
            .call(method, &format!("/session/{}{path}", self.id), body)
            .await
    }

    pub(crate) async fn goto(&self, url: &str) {
        self.call(Method::POST, "/url", json!({ "url": url })).await;
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its value.
    pub(crate) async fn run(&self, script: &str, args: Value) -> Value {
        self.call(
            Method::POST,
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// The text of the first element matching `css`, or `None`.
    pub(crate) async fn text(&self, css: &str) -> Option<String> {
        self.run(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            json!([css]),
        )
        .await
        .as_str()
        .map(str::to_owned)
    }

    /// Waits up to 10 s for `script` to return a truthy value, and returns it.
    pub(crate) async fn wait_for(&self, what: &str, script: &str, args: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.run(script, args.clone()).await;
            let truthy = !matches!(&v, Value::Null | Value::Bool(false)) && v.as_str() != Some("");
            if truthy {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`wait_for`](Self::wait_for) a script that takes no arguments.
    pub(crate) async fn wait_until(&self, what: &str, script: &str) -> Value {
        self.wait_for(what, script, json!([])).await
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .call(
                Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned()
    }

    pub(crate) async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.call(Method::POST, &format!("/element/{e}/click"), json!({}))
            .await;
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.call(Method::POST, &format!("/element/{e}/clear"), json!({}))
            .await;
        self.call(
            Method::POST,
            &format!("/element/{e}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    /// A PNG of the whole page as it is now.
    pub(crate) async fn screenshot(&self) -> Vec<u8> {
        let v = self.call(Method::GET, "/screenshot", json!({})).await;
        base64_decode(v.as_str().expect("base64 png"))
    }

    pub(crate) async fn close(self) {
        self.call(Method::DELETE, "", json!({})).await;
    }
}

/// Standard base64 (what WebDriver sends screenshots in).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u32> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, d) in chunk.iter().enumerate() {
            n |= d << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aWRlbQ=="), b"idem");
    assert_eq!(base64_decode("aWRlbXM="), b"idems");
    assert_eq!(base64_decode("aWRlbXMh"), b"idems!");
}
