//! The contract, one rule per function. Each panics on the first violation.
//!
//! Every rule runs in its own namespace, so rules can share one store and run in parallel.
//! Durations are multiples of [`Harness::lease`](crate::Harness::lease) (`L` below); waits
//! past a deadline add half a lease, and checks before a deadline keep at least half a lease
//! in hand.
//!
//! The rules live by concern: claiming, fencing, how a claim ends (lifecycle), resolves,
//! reads and admin operations, races. [`__rules!`](crate::__rules) lists each rule once;
//! that list makes both [`ALL`] and the tests [`conformance_tests!`](crate::conformance_tests)
//! expands to. A rule missing from it is never re-exported from its module, so it is dead
//! code, which the workspace lints reject.

mod admin;
mod audit;
mod claim;
mod fence;
mod lifecycle;
mod race;
mod resolve;

pub use race::RACERS;

crate::__rules!(__rule_exports {});

/// Every rule, once, grouped by the module that holds it, in the order the suite runs them.
/// Hands the list to the macro `$then` (with `context`) as `module: rule, …; …`.
#[doc(hidden)]
#[macro_export]
macro_rules! __rules {
    ($then:ident { $($ctx:tt)* }) => {
        $crate::$then! { { $($ctx)* }
            claim:
                claim_absent_key_claims,
                busy_while_lease_live,
                done_replays_exact_response,
                mismatch_changes_nothing_in_any_state;
            fence:
                fence_increases_across_takeovers,
                fence_increases_across_expiry,
                fence_increases_across_release_and_delete,
                stale_owner_is_fenced,
                late_holder_settles_until_taken_over;
            lifecycle:
                record_expires_after_ttl,
                renew_extends_lease,
                release_retryable_frees_key,
                release_unknown_holds_key,
                takeover_reexecute_claims_again,
                takeover_hold_marks_unknown;
            resolve:
                resolve_unknown_with_response_replays,
                resolve_unknown_with_release_frees_key,
                resolve_refuses_completed_and_live_processing,
                resolve_missing_is_not_found,
                resolve_expired_lease_processing,
                resolve_naming_a_fence_settles_only_that_attempt;
            admin:
                get_reports_every_state,
                delete_removes_record,
                list_filters_by_namespace_and_principal,
                list_filters_by_state,
                list_oldest_first_with_limit_and_age,
                list_orders_reclaimed_key_by_new_age,
                request_id_kept_on_record;
            audit:
                audit_trail_follows_claim_timeout_unknown_resolve,
                audit_records_every_change_and_nothing_else,
                audit_query_filters,
                audit_default_level_records_what_an_operator_needs;
            race:
                race_one_claim_wins,
                race_one_takeover_wins,
                race_mixed_fingerprints_one_wins;
        }
    };
}

/// Re-exports every rule from its module, and names them all in [`ALL`].
#[doc(hidden)]
#[macro_export]
macro_rules! __rule_exports {
    ({} $($module:ident: $($rule:ident),+;)+) => {
        $(pub use $module::{$($rule),+};)+

        /// Every rule's name, in the order [`conformance_tests!`](crate::conformance_tests)
        /// runs them.
        pub const ALL: &[&str] = &[$($(stringify!($rule)),+),+];
    };
}

/// One `#[test]` per rule, each on its own runtime with the harness `$harness`.
#[doc(hidden)]
#[macro_export]
macro_rules! __rule_tests {
    ({ $harness:expr } $($module:ident: $($rule:ident),+;)+) => {
        $($(
            #[test]
            fn $rule() {
                $crate::__private::run(async {
                    let harness = $harness;
                    $crate::rules::$rule(&harness).await;
                });
            }
        )+)+
    };
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    #[test]
    fn every_rule_is_named_once() {
        let unique: BTreeSet<&str> = super::ALL.iter().copied().collect();
        assert_eq!(unique.len(), super::ALL.len(), "{:?}", super::ALL);
        assert_eq!(super::ALL.len(), 35);
    }
}
