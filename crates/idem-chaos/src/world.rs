//! Everything a run's nemesis acts on: the idem processes, the store and the links between
//! them, and how to (re)start each process with its configuration.

use std::path::PathBuf;
use std::time::Duration;

use crate::gateway::{Role, Routes, Slot};
use crate::link::{Link, Mode};
use crate::store::Store;

/// The processes, the store and the links of a run.
#[derive(Debug)]
pub struct World {
    /// The `idem` binary.
    pub idem: PathBuf,
    /// The run's id (Redis key prefix).
    pub run: String,
    /// The gateways.
    pub gateways: Vec<Slot>,
    /// The relay processes.
    pub relays: Vec<Slot>,
    /// The store.
    pub store: Store,
    /// One link per gateway, then one per relay, when the store is reached through links.
    pub links: Vec<Link>,
    /// The routes' settings.
    pub routes: Routes,
    /// The upstream's URL for each gateway, then each relay.
    pub upstreams: Vec<String>,
    /// The `[[relay]]` tables of the relays' configuration, by relay.
    pub relay_tables: Vec<String>,
}

impl World {
    fn store_url(&self, index: usize) -> String {
        self.store.url(self.links.get(index).map(Link::addr))
    }

    /// The configuration gateway `i` starts with now.
    pub fn gateway_config(&self, i: usize) -> String {
        let Some(slot) = self.gateways.get(i) else {
            return String::new();
        };
        self.routes.serve(
            slot.port,
            slot.admin,
            self.upstreams.get(i).map_or("", String::as_str),
            &self.store_url(i),
            &self.store.options(&self.run),
        )
    }

    /// The configuration relay `i` starts with now.
    pub fn relay_config(&self, i: usize) -> String {
        let index = self.gateways.len() + i;
        self.routes.relay(
            self.upstreams.get(index).map_or("", String::as_str),
            &self.store_url(index),
            &self.store.options(&self.run),
            self.relay_tables.get(i).map_or("", String::as_str),
        )
    }

    /// The slot of `role` number `i`.
    pub fn slot(&self, role: Role, i: usize) -> Option<&Slot> {
        match role {
            Role::Serve => self.gateways.get(i),
            Role::Relay => self.relays.get(i),
        }
    }

    /// (Re)starts `role` number `i`, trying until it is ready or `limit` passes.
    ///
    /// # Errors
    /// It never got ready.
    pub async fn start(&self, role: Role, i: usize, limit: Duration) -> anyhow::Result<()> {
        let Some(slot) = self.slot(role, i) else {
            anyhow::bail!("no {role:?} {i}");
        };
        let config = || match role {
            Role::Serve => self.gateway_config(i),
            Role::Relay => self.relay_config(i),
        };
        slot.start_until(&self.idem, config, self.routes.planted, limit)
            .await
    }

    /// Lifts every fault: links pass, the store and every process run, nothing is stopped.
    /// Answers what it had to restart.
    pub async fn heal(&self) -> Vec<String> {
        for link in &self.links {
            link.set(Mode::Pass);
        }
        let _ = self.store.freeze(false);
        let mut restarted = Vec::new();
        for (role, slots) in [(Role::Serve, &self.gateways), (Role::Relay, &self.relays)] {
            for (i, slot) in slots.iter().enumerate() {
                slot.pause(false);
                if !slot.up() {
                    match self.start(role, i, Duration::from_secs(60)).await {
                        Ok(()) => restarted.push(slot.name.clone()),
                        Err(e) => restarted.push(format!("{} (failed: {e:#})", slot.name)),
                    }
                }
            }
        }
        restarted
    }
}
