//! Helpers the unit tests share.

use http::Request;
use http::request::Parts;

/// The head of a request with `method`, `uri` and `headers`.
pub(crate) fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut b = Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).expect("request").into_parts().0
}
