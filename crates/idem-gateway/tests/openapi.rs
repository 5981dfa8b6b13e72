//! The admin listener serves the OpenAPI description without a token, and it is the file
//! `docs/openapi.json` (which a unit test keeps equal to what the code generates and
//! `scripts/check-openapi.sh` validates).

mod common;

use common::{ADMIN_TOKEN, Gateway, Http, Upstream};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_the_committed_description() {
    let up = Upstream::start().await;
    let config = format!(
        "upstream = \"{}\"\nstore = \"memory:\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{ADMIN_TOKEN}\"\n\n\
         [defaults]\nnamespace = \"api\"\nprincipal = {{ from = \"none\" }}\n\n\
         [[routes]]\nname = \"charge\"\nmethod = \"POST\"\npath = \"/charge\"\n",
        up.url()
    );
    let gw = Gateway::start(&config, &[]);
    let r = Http::new().get(&gw.admin_url("/openapi.json")).await;
    assert_eq!(r.status, StatusCode::OK, "open, as /healthz is");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let committed = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.json"
    ))
    .expect("docs/openapi.json");
    assert!(
        r.body == committed,
        "the served description is not docs/openapi.json"
    );
}
