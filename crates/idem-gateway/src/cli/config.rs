//! The whole configuration as the commands run it: the gateway's [`Settings`] and the relays
//! that follow its routes, each compiled where it lives (`crate::config`, `crate::relay`),
//! and what `idem check-config` prints of them.

use std::fmt;

use crate::config::{self, RawConfig, Settings, Sources};
use crate::relay::{self, RelaySettings};

/// A checked configuration: the gateway's settings and its `[[relay]]`s.
#[derive(Debug, Clone)]
pub struct Checked {
    /// What `idem serve` runs.
    pub settings: Settings,
    /// What `idem relay` runs, checked against `settings`' routes.
    pub relays: Vec<RelaySettings>,
}

/// Compiles the settings, then the relays against their routes.
///
/// # Errors
/// As [`config::compile`], then the first `[[relay]]` that is wrongly written, incomplete or
/// names a missing route.
pub fn compile(raw: &RawConfig) -> anyhow::Result<Checked> {
    let settings = config::compile(raw)?;
    let relays = relay::compile(raw.relay.as_deref().unwrap_or_default(), &settings.routes)?;
    Ok(Checked { settings, relays })
}

impl Checked {
    /// [`Settings::risks`], each route's naming the relays that follow it.
    pub fn risks(&self) -> Vec<String> {
        self.settings
            .risks_with(|route| relay::following(&self.relays, route))
    }

    /// What `idem check-config` prints for a valid configuration: where it came from, the
    /// settings and relays, their risks and the verdict.
    pub fn report(&self, sources: &Sources) -> String {
        use fmt::Write as _;
        let mut out = String::new();
        match &sources.file {
            Some(f) => {
                let _ = writeln!(
                    out,
                    "config:    {} (then IDEM_* variables, then flags)",
                    f.display()
                );
            }
            None => out.push_str("config:    no file (IDEM_* variables and flags only)\n"),
        }
        if !sources.env.is_empty() {
            let _ = writeln!(out, "env:       {}", sources.env.join(", "));
        }
        let _ = write!(out, "{self}");
        let promise = self.risks();
        let credentials = self.settings.credential_risks();
        for risk in promise.iter().chain(&credentials) {
            let _ = writeln!(out, "risk:      {risk}");
        }
        out.push_str(&verdict(promise.len(), credentials.len()));
        out.push('\n');
        out
    }
}

/// The last line of `check-config`: valid, and how many risks of each kind were named.
fn verdict(promise: usize, credentials: usize) -> String {
    match (promise, credentials) {
        (0, 0) => "ok: configuration is valid".to_owned(),
        (n, 0) => format!(
            "ok: configuration is valid, with {n} risk(s) to the at-most-once promise above"
        ),
        (0, c) => {
            format!("ok: configuration is valid, with {c} risk(s) to whose keys they are above")
        }
        (n, c) => format!(
            "ok: configuration is valid, with {} risk(s) above: {n} to the at-most-once promise, {c} to whose keys they are",
            n + c
        ),
    }
}

/// The settings, then the relays run by `idem relay`.
impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.settings)?;
        if !self.relays.is_empty() {
            writeln!(f, "relays:    {} (run by `idem relay`):", self.relays.len())?;
            for r in &self.relays {
                write!(f, "{r}")?;
            }
        }
        Ok(())
    }
}
