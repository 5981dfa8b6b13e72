//! Route matching: the methods and the path pattern of a route, checked on every request.

use std::fmt;

use anyhow::bail;
use http::Method;

/// The methods a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MethodSet {
    /// Any method.
    Any,
    /// These.
    Only(Vec<Method>),
}

impl MethodSet {
    /// Whether `m` is in the set.
    pub fn contains(&self, m: &Method) -> bool {
        match self {
            Self::Any => true,
            Self::Only(list) => list.contains(m),
        }
    }
}

impl fmt::Display for MethodSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Only(list) => {
                let names: Vec<&str> = list.iter().map(Method::as_str).collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

/// A path pattern: literal segments, `{name}` for any one segment, a trailing `*` for the rest.
///
/// Patterns are matched against normalised paths ([`crate::path`]); literal segments compare
/// without regard to ASCII case unless the pattern was built case-sensitive, because many
/// servers route `/CHARGE` to the `/charge` handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    rest: bool,
    ignore_case: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
}

impl PathPattern {
    /// Parses a pattern such as `/v1/orders/{id}/pay` or `/v1/*`.
    ///
    /// # Errors
    /// A message naming the problem.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some(body) = text.strip_prefix('/') else {
            bail!("path `{text}` must start with /");
        };
        let mut segments = Vec::new();
        let mut rest = false;
        let parts: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            if *part == "*" {
                if i + 1 != parts.len() {
                    bail!("path `{text}`: `*` may only be the last segment");
                }
                rest = true;
            } else if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
                segments.push(Segment::Param(part[1..part.len() - 1].to_owned()));
            } else if part.contains(['{', '}', '*', '?', '#']) {
                bail!("path `{text}`: segment `{part}` must be a literal, {{name}} or a final *");
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
            rest,
            ignore_case: true,
        })
    }

    /// Whether `path` (no query) matches. Runs on every request: walks the segments without
    /// collecting them.
    pub fn matches(&self, path: &str) -> bool {
        let body = path.strip_prefix('/').unwrap_or(path);
        let mut parts = (!body.is_empty())
            .then(|| body.split('/'))
            .into_iter()
            .flatten();
        for seg in &self.segments {
            let Some(part) = parts.next() else {
                return false;
            };
            let ok = match seg {
                Segment::Literal(l) if self.ignore_case => l.eq_ignore_ascii_case(part),
                Segment::Literal(l) => l == part,
                Segment::Param(_) => !part.is_empty(),
            };
            if !ok {
                return false;
            }
        }
        self.rest || parts.next().is_none()
    }

    /// `path` with each literal segment spelled as in the pattern, when `path` matches it
    /// only with another letter case; `None` when it is already spelled so. The upstream then
    /// receives exactly the path the route names, and `/CHARGE` and `/charge` are one request.
    pub fn respell(&self, path: &str) -> Option<String> {
        if !self.ignore_case {
            return None;
        }
        let body = path.strip_prefix('/')?;
        let mut parts: Vec<&str> = body.split('/').collect();
        let mut changed = false;
        for (seg, part) in self.segments.iter().zip(parts.iter_mut()) {
            if let Segment::Literal(l) = seg
                && l != part
                && l.eq_ignore_ascii_case(part)
            {
                *part = l;
                changed = true;
            }
        }
        changed.then(|| format!("/{}", parts.join("/")))
    }

    /// The names of the pattern's `{name}` parameters, in order.
    pub fn param_names(&self) -> Vec<&str> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Param(name) => Some(name.as_str()),
                Segment::Literal(_) => None,
            })
            .collect()
    }

    /// The values of the pattern's parameters in `path` (which it matches), by name.
    pub fn params(&self, path: &str) -> Vec<(String, String)> {
        let body = path.strip_prefix('/').unwrap_or(path);
        self.segments
            .iter()
            .zip(body.split('/'))
            .filter_map(|(s, part)| match s {
                Segment::Param(name) => Some((name.clone(), part.to_owned())),
                Segment::Literal(_) => None,
            })
            .collect()
    }

    /// The same pattern with literal segments compared exactly (`path_case = "sensitive"`).
    #[must_use]
    pub fn case_sensitive(mut self) -> Self {
        self.ignore_case = false;
        self
    }

    /// Whether literal segments compare without regard to case.
    pub fn ignores_case(&self) -> bool {
        self.ignore_case
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A straightforward matcher that collects the segments; the allocation-free one must
    /// agree with it everywhere.
    fn collecting_match(p: &PathPattern, path: &str) -> bool {
        let body = path.strip_prefix('/').unwrap_or(path);
        let mut parts = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect::<Vec<_>>()
        };
        if p.rest {
            if parts.len() < p.segments.len() {
                return false;
            }
            parts.truncate(p.segments.len());
        } else if parts.len() != p.segments.len() {
            return false;
        }
        p.segments.iter().zip(parts).all(|(seg, part)| match seg {
            Segment::Literal(l) if p.ignore_case => l.eq_ignore_ascii_case(part),
            Segment::Literal(l) => l == part,
            Segment::Param(_) => !part.is_empty(),
        })
    }

    #[test]
    fn path_matching_agrees_with_the_collecting_matcher() {
        let patterns = [
            "/",
            "/*",
            "/a",
            "/a/*",
            "/a/b",
            "/{x}",
            "/{x}/*",
            "/a/{x}/b",
            "/a/{x}/b/*",
        ];
        let paths = [
            "", "/", "//", "/A", "/A/x/B", "/a", "/a/", "/a/b", "/a/b/", "/a//b", "/a/x/b",
            "/a/x/b/c", "/b", "/a/b/c/d", "a", "a/b", "/x/a",
        ];
        let mut checked = 0;
        for pattern in patterns {
            for p in [
                PathPattern::parse(pattern).expect("valid"),
                PathPattern::parse(pattern).expect("valid").case_sensitive(),
            ] {
                for path in paths {
                    assert_eq!(
                        p.matches(path),
                        collecting_match(&p, path),
                        "{pattern} against {path:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 2 * patterns.len() * paths.len());
    }

    #[test]
    fn path_patterns_match_segments() {
        let p = PathPattern::parse("/v1/orders/{id}/pay").expect("valid");
        assert!(p.matches("/v1/orders/42/pay"));
        assert!(p.matches("/V1/Orders/42/PAY"), "literals ignore case");
        assert_eq!(
            p.respell("/V1/Orders/AbC/PAY").as_deref(),
            Some("/v1/orders/AbC/pay"),
            "literals take the pattern's spelling; parameters keep theirs"
        );
        assert_eq!(p.respell("/v1/orders/AbC/pay"), None);
        assert_eq!(p.param_names(), vec!["id"]);
        assert_eq!(
            p.params("/v1/orders/AbC/pay"),
            vec![("id".to_owned(), "AbC".to_owned())]
        );
        assert!(!p.clone().case_sensitive().matches("/V1/orders/42/pay"));
        assert!(!p.matches("/v1/orders//pay"));
        assert!(!p.matches("/v1/orders/42/pay/x"));
        let rest = PathPattern::parse("/v1/*").expect("valid");
        assert!(rest.matches("/v1/a/b"));
        assert!(rest.matches("/v1"));
        assert!(!rest.matches("/v2/a"));
        assert!(PathPattern::parse("/*").expect("valid").matches("/"));
        assert!(PathPattern::parse("/").expect("valid").matches("/"));
        assert!(!PathPattern::parse("/").expect("valid").matches("/a"));
        assert!(PathPattern::parse("v1").is_err());
        assert!(PathPattern::parse("/a/*/b").is_err());
        assert!(PathPattern::parse("/a{b").is_err());
    }
}
