//! Stored text made safe to print on a terminal: keys, principals, request ids and bodies
//! come from callers and upstreams, and a control character among them (ESC starting a
//! terminal escape sequence, CR rewriting the line, a bidi override reordering it) would let
//! them repaint or disguise what an operator reads.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every character a terminal would act on, rather than show, written as a
/// visible escape: C0 controls (tab and newline too, so a row stays one line), DEL and C1
/// controls as `\xNN` or `\n`, `\r`, `\t`; bidi controls (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069) as `\u{…}`. Everything else, backslashes included, is left
/// as it is, so a key (printable ASCII) reads and copies exactly; `--json` is the exact form
/// of any value.
pub(crate) fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acted_on) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() && u32::from(c) <= 0xff => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if acted_on(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether a terminal acts on `c` instead of showing it.
fn acted_on(c: char) -> bool {
    // `char::is_control` is exactly C0, DEL and C1.
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_shown_not_obeyed() {
        // Regression: `idem admin` printed stored strings raw, so a body holding
        // `ESC ] 0 ; … BEL` retitled the operator's terminal and `ESC [ 2 J` cleared it.
        assert_eq!(
            visible("paid\u{1b}[2J\u{1b}]0;x\u{7}"),
            "paid\\x1b[2J\\x1b]0;x\\x07"
        );
        assert_eq!(
            visible("a\rb\nc\td\u{7f}e\u{9b}f"),
            "a\\rb\\nc\\td\\x7fe\\x9bf"
        );
        assert_eq!(
            visible("user\u{202e}gpj.exe\u{2066}\u{2069}\u{200f}"),
            "user\\u{202e}gpj.exe\\u{2066}\\u{2069}\\u{200f}"
        );
        assert_eq!(visible("\u{0}"), "\\x00");
    }

    #[test]
    fn ordinary_text_is_untouched() {
        for s in ["order-42", r"a\x1b", "h:0123abcd", "zoë 東京 🚀", ""] {
            assert!(matches!(visible(s), Cow::Borrowed(b) if b == s), "{s}");
        }
    }
}
