//! The switches of the protocol and the bounds of the check.

/// What a claim does to a processing record whose lease has run out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Takeover {
    /// Claim it again with the next fence and run again: today's default, and the bug (the
    /// first holder's request may already have acted, or may still act).
    Reexecute,
    /// Make it unknown, same owner and fence: nothing runs again until the outcome is known.
    Hold,
}

/// One variant of the protocol and the bounds to check it within.
///
/// Every rule of the new design is a switch, so that each can be shown to matter: turn one
/// off and the checker should find the property it protects broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// Rule 3: what a claim does to an expired lease.
    pub takeover: Takeover,
    /// Rule 4: an unknown record is settled by asking the upstream's status webhook; without
    /// it, a claim that finds an unknown record answers "outcome unknown".
    pub probe: bool,
    /// Rule 4: the upstream's "not done" is trusted only once the attempt's window has passed
    /// (checked before asking, so no request of that attempt can still act).
    pub window_rule: bool,
    /// Where the window rule reads the window: before the upstream is asked (true, the rule),
    /// or only when the prober resolves (false: a request can execute between a "not done"
    /// and a window that passes after it, and the late read would miss it).
    pub window_read_before_probe: bool,
    /// Rule 4: a resolve acts only if the record still has the fence the prober read. Without
    /// it, a resolve acts like the operator's resolve today: on any unknown record, or on a
    /// processing one whose lease has run out, whatever its fence.
    pub fence_guarded_resolve: bool,
    /// Rule 5: a holder may complete its own record after it became unknown (same owner and
    /// fence). Without it only a processing record (expired or not) takes a completion.
    pub late_complete: bool,
    /// Whether a gateway's handler timeout may fire while its request can still execute (the
    /// upstream's window is longer than the handler's timeout). When false it fires only once
    /// the attempt's window has passed (the gateway handed its own deadline to the upstream).
    pub timeout_before_window: bool,
    /// How many gateways serve the key.
    pub gateways: u8,
    /// How many clients send requests with the key.
    pub clients: u8,
    /// How many requests each client sends at most: the first one and its retries.
    pub requests_per_client: u8,
    /// How many gateway crashes may happen in one run.
    pub crashes: u8,
    /// How many pauses (a holder stalled past its lease) may happen in one run.
    pub pauses: u8,
}

impl Config {
    /// The new design: hold, probe, window rule, fence-guarded resolve, late completion;
    /// handler timeouts at any time; 2 gateways, 1 client with 3 requests, 1 crash, 1 pause.
    pub const fn fixed() -> Self {
        Self {
            takeover: Takeover::Hold,
            probe: true,
            window_rule: true,
            window_read_before_probe: true,
            fence_guarded_resolve: true,
            late_complete: true,
            timeout_before_window: true,
            gateways: 2,
            clients: 1,
            requests_per_client: 3,
            crashes: 1,
            pauses: 1,
        }
    }

    /// What idem does today: an expired lease is taken over and run again; no status probe
    /// (so no resolve on the request path) and no completion of an unknown record. Same bounds
    /// as [`Config::fixed`].
    pub const fn today() -> Self {
        Self {
            takeover: Takeover::Reexecute,
            probe: false,
            window_rule: false,
            fence_guarded_resolve: false,
            late_complete: false,
            ..Self::fixed()
        }
    }
}
