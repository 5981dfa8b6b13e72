//! Durations (`500ms`, `45s`, `1m30s`, `1.5s`, `24h`, `7d`; parsed by `humantime`) and byte
//! sizes (`4096`, `64KiB`, `1MiB`, `64kB`; parsed by `bytesize`, so `kB` is 1000 bytes and
//! `KiB` 1024).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written with a unit: `250ms`, `45s`, `2m`, `24h`, `7d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl Dur {
    /// Parses a duration with units, such as `500ms`, `45s`, `1m30s`, `1.5s` or `24h`. A bare
    /// number has no unit and is refused, so `5` is never read as the wrong one.
    ///
    /// # Errors
    /// A message saying what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        humantime::parse_duration(text.trim()).map(Self).map_err(|e| {
            format!(
                "`{text}` is not a duration ({e}): write a number with a unit, e.g. 500ms, 45s, 1m30s, 24h"
            )
        })
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        for (unit, per) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if ms != 0 && ms.is_multiple_of(per) {
                return write!(f, "{}{unit}", ms / per);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration with a unit, such as \"500ms\", \"45s\" or \"24h\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                Dur::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{v}` has no unit: write e.g. \"{v}s\" or \"{v}ms\""
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{v}` has no unit: write e.g. \"{v}s\" or \"{v}ms\""
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// A size in bytes: a bare number, or a number with `B`, `KiB`, `MiB`, `GiB`, `KB`, `MB`, `GB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses a size: bytes, or a number with a unit (`KiB`, `MiB`, `GiB` are powers of
    /// 1024; `kB`, `MB`, `GB` powers of 1000).
    ///
    /// # Errors
    /// A message saying what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<bytesize::ByteSize>()
            .map(|b| Self(b.as_u64()))
            .map_err(|e| {
                format!(
                    "`{text}` is not a size ({e}): write bytes, or a number with KiB, MiB or GiB"
                )
            })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, per) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if n != 0 && n.is_multiple_of(per) {
                return write!(f, "{}{unit}", n / per);
            }
        }
        write!(f, "{n}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 65536, \"64KiB\" or \"1MiB\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(Dur::parse("500ms"), Ok(Dur(Duration::from_millis(500))));
        assert_eq!(Dur::parse("45s"), Ok(Dur(Duration::from_secs(45))));
        assert_eq!(Dur::parse("24h"), Ok(Dur(Duration::from_secs(86_400))));
        assert!(Dur::parse("45").is_err());
        assert!(Dur::parse("s").is_err());
        assert!(Dur::parse("-1s").is_err());
        assert!(Dur::parse("99999999999999999999d").is_err());
        assert_eq!(Dur::parse("1m30s"), Ok(Dur(Duration::from_secs(90))));
        assert_eq!(Dur::parse("1.5s"), Ok(Dur(Duration::from_millis(1500))));
        assert_eq!(Dur(Duration::from_secs(90)).to_string(), "90s");
        assert_eq!(Dur(Duration::from_millis(1500)).to_string(), "1500ms");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(ByteSize::parse("1MiB"), Ok(ByteSize(1 << 20)));
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("64KB"), Ok(ByteSize(64_000)));
        assert_eq!(ByteSize::parse("64kB"), Ok(ByteSize(64_000)));
        assert_eq!(ByteSize::parse("64KiB"), Ok(ByteSize(64 << 10)));
        assert!(ByteSize::parse("1 parsec").is_err());
        assert_eq!(ByteSize(1 << 20).to_string(), "1MiB");
    }
}
