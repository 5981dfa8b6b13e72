//! The table a store keeps its records in.

use std::fmt;

use thiserror::Error;

/// The table used when none is configured.
pub const DEFAULT_TABLE: &str = "idem_records";

/// Longest table name accepted: leaves room for the suffixes of index and migration tables
/// within PostgreSQL's 63-byte identifier limit.
const MAX_TABLE_LEN: usize = 48;

/// A validated table name: an ASCII letter or `_`, then letters, digits or `_`, at most 48
/// characters. It is spliced into SQL, so nothing else is ever accepted.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

/// A table name was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "invalid table name {0:?}: use 1-48 ASCII letters, digits or '_', not starting with a digit"
)]
pub struct TableNameError(pub String);

impl TableName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`TableNameError`] unless `name` is 1–48 characters of `[A-Za-z0-9_]`, not starting
    /// with a digit.
    pub fn new(name: impl Into<String>) -> Result<Self, TableNameError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= MAX_TABLE_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if ok {
            Ok(Self(name))
        } else {
            Err(TableNameError(name))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(DEFAULT_TABLE.to_owned())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers_only() {
        assert!(TableName::new("idem_records").is_ok());
        assert!(TableName::new("_t1").is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a;drop table x",
            "a b",
            "\"x\"",
            "a.b",
            &"x".repeat(49),
        ] {
            assert!(TableName::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}
