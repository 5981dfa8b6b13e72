//! How much of a record's life a store writes to the trail: [`AuditLevel`].

use std::fmt;
use std::str::FromStr;

use super::AuditKind;
use crate::record::{Record, RecordState};

/// Which state changes a store records in its audit trail.
///
/// A request that claims a key and completes it is already described by its record:
/// `created_at`, `fence`, `request_id`, and once completed the response's status and
/// `completed_at`. Writing those two events again would cost every first request an extra
/// write (on Redis an `XADD` in each of its two scripts) for history nobody reads. So by
/// default ([`AuditLevel::Operator`]) a store records what an operator needs and the record
/// cannot tell: how an attempt ended other than by completing (released, unknown, taken
/// over, fenced), who settled it by hand (resolved, deleted) and when it went (expired).
/// [`AuditLevel::All`] records every transition.
///
/// ```
/// use idem_core::audit::{AuditKind, AuditLevel};
///
/// assert_eq!(AuditLevel::default(), AuditLevel::Operator);
/// assert!(!AuditLevel::Operator.records(AuditKind::Claimed, None));
/// assert!(AuditLevel::Operator.records(AuditKind::TakenOver, None));
/// assert!(AuditLevel::All.records(AuditKind::Claimed, None));
/// assert_eq!("all".parse::<AuditLevel>(), Ok(AuditLevel::All));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditLevel {
    /// Everything but the routine path: a fresh claim ([`AuditKind::Claimed`]) and the
    /// holder completing its processing record ([`AuditKind::Completed`]) are not written.
    ///
    /// A re-claim after a release, resolve or delete is a fresh claim too: the event that
    /// freed the key ends the earlier attempt in the trail (with its fence and request id),
    /// and the new attempt is the record until it ends, and every way it can end other than
    /// completing is written. A completion that settles an *unknown* record (its holder
    /// came back after its lease ran out under `hold`) is written: it is why an unknown
    /// in the trail never needed a resolve.
    #[default]
    Operator,
    /// Every transition, the routine claims and completions included.
    All,
}

impl AuditLevel {
    /// Both levels, the default first.
    pub const ALL: [AuditLevel; 2] = [AuditLevel::Operator, AuditLevel::All];

    /// The name used in configuration: `operator` or `all`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AuditLevel::Operator => "operator",
            AuditLevel::All => "all",
        }
    }

    /// Whether a store at this level writes an event of `kind` made by a change of
    /// `previous` (the record the operation found, if any).
    pub fn records(self, kind: AuditKind, previous: Option<&Record>) -> bool {
        self == AuditLevel::All || !routine(kind, previous)
    }
}

/// Whether `kind`, on a change of `previous`, is the routine path the record describes: a
/// fresh claim, or a completion of a record that was not unknown.
fn routine(kind: AuditKind, previous: Option<&Record>) -> bool {
    match kind {
        AuditKind::Claimed => true,
        AuditKind::Completed => {
            !previous.is_some_and(|r| matches!(r.state, RecordState::Unknown { .. }))
        }
        _ => false,
    }
}

impl fmt::Display for AuditLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an [`AuditLevel`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown audit level `{0}`: use operator or all")]
pub struct AuditLevelError(pub String);

impl FromStr for AuditLevel {
    type Err = AuditLevelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| AuditLevelError(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::key::{Key, Scope, ScopedKey};
    use crate::record::{OwnerId, Timestamp};

    fn record(state: RecordState) -> Record {
        Record {
            key: ScopedKey::new(Scope::new("ns").expect("ns"), Key::new("k").expect("key")),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            fence: 1,
            request_id: None,
            created_at: Timestamp(1),
            expires_at: Timestamp(100),
            state,
        }
    }

    #[test]
    fn the_operator_level_leaves_out_only_the_routine_path() {
        let processing = record(RecordState::Processing {
            owner: OwnerId(1),
            lease_until: Timestamp(50),
        });
        let unknown = record(RecordState::Unknown {
            since: Timestamp(60),
            owner: Some(OwnerId(1)),
        });
        let op = AuditLevel::Operator;
        assert!(!op.records(AuditKind::Claimed, None));
        assert!(!op.records(AuditKind::Completed, Some(&processing)));
        assert!(
            op.records(AuditKind::Completed, Some(&unknown)),
            "a late holder settling an unknown record is written"
        );
        for kind in AuditKind::ALL {
            assert!(AuditLevel::All.records(kind, Some(&processing)));
            if !matches!(kind, AuditKind::Claimed | AuditKind::Completed) {
                assert!(op.records(kind, Some(&processing)), "{kind}");
            }
        }
    }

    #[test]
    fn levels_round_trip_by_name() {
        for level in AuditLevel::ALL {
            assert_eq!(level.as_str().parse::<AuditLevel>(), Ok(level));
        }
        assert!("every".parse::<AuditLevel>().is_err());
    }
}
