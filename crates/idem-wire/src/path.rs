//! A key in a URL: how the status endpoint's path and a status webhook's URL carry one.

/// Percent-encodes everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`), so
/// `text` stands as one path segment or one query value whatever it holds.
///
/// ```
/// assert_eq!(idem_wire::path::segment("order 42/a"), "order%2042%2Fa");
/// ```
#[must_use]
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

#[cfg(test)]
mod tests {
    use super::segment;

    #[test]
    fn only_unreserved_bytes_stand_as_themselves() {
        assert_eq!(segment("Az09-._~"), "Az09-._~");
        assert_eq!(segment("a b/c?d#e%f"), "a%20b%2Fc%3Fd%23e%25f");
        assert_eq!(segment("é"), "%C3%A9");
        assert_eq!(segment(""), "");
    }
}
