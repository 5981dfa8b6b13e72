//! The message carriers' vocabulary (idem-mq's consumers, `idem relay`, the outbox): the
//! headers idem adds to a message it sends back or dead-letters, and the names of the
//! reasons a message is dead-lettered for.

/// Failed handler attempts so far (RabbitMQ copies sent back for another attempt).
pub const ATTEMPTS: &str = "x-idem-attempts";
/// Why a message was dead-lettered: a [`DeadLetter::slug`].
pub const REASON: &str = "x-idem-reason";
/// The engine's outcome for the dead-lettered delivery (`idem_core::Outcome`'s label).
pub const OUTCOME: &str = "x-idem-outcome";
/// The message id of the original, on a JetStream dead letter (which gets an id of its own).
pub const ORIGINAL_ID: &str = "x-idem-original-id";

/// Why a message was dead-lettered, as the [`REASON`] header names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetter {
    /// No key source was present.
    NoKey,
    /// A key source was present but unusable.
    BadKey,
    /// The key was used with a different payload.
    Mismatch,
    /// The handler failed on every attempt.
    Exhausted,
    /// The handler refused the message for good.
    Permanent,
    /// The outcome of an earlier attempt is unknown; an operator resolves the record.
    Unknown,
}

impl DeadLetter {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 6] = [
        Self::NoKey,
        Self::BadKey,
        Self::Mismatch,
        Self::Exhausted,
        Self::Permanent,
        Self::Unknown,
    ];

    /// The stable name in the [`REASON`] header.
    pub fn slug(self) -> &'static str {
        match self {
            Self::NoKey => "no_key",
            Self::BadKey => "bad_key",
            Self::Mismatch => "mismatch",
            Self::Exhausted => "exhausted",
            Self::Permanent => "permanent",
            Self::Unknown => "unknown",
        }
    }

    /// The reason a [`REASON`] header names; `None` for a name idem does not write.
    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.slug() == slug)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slug_reads_back_and_no_two_are_alike() {
        for r in DeadLetter::ALL {
            assert_eq!(DeadLetter::from_slug(r.slug()), Some(r));
        }
        let mut slugs: Vec<_> = DeadLetter::ALL.iter().map(|r| r.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), DeadLetter::ALL.len());
        assert_eq!(DeadLetter::from_slug("no-key"), None);
    }
}
