//! Reloading routes, policies and certificates while the gateway runs (SIGHUP or
//! `POST /admin/reload`).
//!
//! The configuration is read again from the same file, environment and flags. Everything is
//! built first (routes, the upstream client, TLS configurations) and swapped in only if all of
//! it succeeds, so a bad configuration leaves the running one untouched and the reason is
//! logged and answered. Requests in progress finish on the configuration they started with;
//! open connections stay open. What a running process cannot change in place (listener
//! addresses, the store, TLS on or off, the admin token, connection limits) is refused with a
//! message saying a restart is needed.

use std::sync::Arc;

use anyhow::bail;
use arc_swap::ArcSwap;

use crate::app::App;
use crate::config::Settings;
use crate::listener::Tls;
use crate::shared::GatewayStore;
use crate::tokens::GatewayTokens;
use crate::upstream::{Clients, UpstreamSpec};

/// Reads the configuration again, from wherever it first came from.
pub(crate) type LoadSettings = Box<dyn Fn() -> anyhow::Result<Settings> + Send + Sync>;

/// The running gateway's replaceable parts.
pub struct Live {
    app: ArcSwap<App>,
    settings: ArcSwap<Settings>,
    data_tls: Arc<Tls>,
    admin_tls: Arc<Tls>,
    store: GatewayStore,
    /// The built-in demo upstream's address, standing in for a missing `upstream`.
    demo_upstream: Option<UpstreamSpec>,
    load: LoadSettings,
    /// The token store, opened when the first token route appears and kept from then on
    /// (issued tokens outlive reloads). Set only while `reloading` is held.
    tokens: parking_lot::Mutex<Option<GatewayTokens>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Live {
    /// The running state for `settings` over `store`.
    ///
    /// # Errors
    /// A route that cannot be built (a token route without `tokens`), or certificates that
    /// cannot be read.
    pub fn new(
        settings: Settings,
        store: GatewayStore,
        tokens: Option<GatewayTokens>,
        demo_upstream: Option<UpstreamSpec>,
        load: LoadSettings,
    ) -> anyhow::Result<Self> {
        let app = build_app(&settings, &store, tokens.as_ref(), demo_upstream.as_ref())?;
        let data_tls = Arc::new(Tls::new(settings.tls.as_ref())?);
        let admin_tls = Arc::new(Tls::new(
            settings.admin.as_ref().and_then(|a| a.tls.as_ref()),
        )?);
        Ok(Self {
            app: ArcSwap::from_pointee(app),
            settings: ArcSwap::from_pointee(settings),
            data_tls,
            admin_tls,
            store,
            demo_upstream,
            load,
            tokens: parking_lot::Mutex::new(tokens),
            reloading: tokio::sync::Mutex::new(()),
        })
    }

    /// The data plane in force now.
    pub fn app(&self) -> Arc<App> {
        self.app.load_full()
    }

    /// The settings in force now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// The data listener's TLS acceptor.
    pub fn data_tls(&self) -> Arc<Tls> {
        Arc::clone(&self.data_tls)
    }

    /// The admin listener's TLS acceptor.
    pub fn admin_tls(&self) -> Arc<Tls> {
        Arc::clone(&self.admin_tls)
    }

    /// The store.
    pub fn store(&self) -> &GatewayStore {
        &self.store
    }

    /// Reads the configuration again and, if it is valid and changes only what can change
    /// in place, switches to it. Returns a one-line summary.
    ///
    /// # Errors
    /// Why the new configuration was refused; the running one is kept.
    pub async fn reload(&self) -> anyhow::Result<String> {
        let _one = self.reloading.lock().await;
        let next = (self.load)()?;
        let now = self.settings();
        restart_only(&now, &next)?;
        // Build everything before swapping anything.
        let mut tokens = self.tokens.lock().clone();
        if tokens.is_none() && next.routes.iter().any(|r| r.policy.token.is_some()) {
            let opened =
                GatewayTokens::open(&next.store, &next.store_options, next.store_timeout).await?;
            *self.tokens.lock() = Some(opened.clone());
            tokens = Some(opened);
        }
        let app = build_app(
            &next,
            &self.store,
            tokens.as_ref(),
            self.demo_upstream.as_ref(),
        )?;
        let data = crate::tls::server_config_opt(next.tls.as_ref())?;
        let admin =
            crate::tls::server_config_opt(next.admin.as_ref().and_then(|a| a.tls.as_ref()))?;
        self.data_tls.set(data);
        self.admin_tls.set(admin);
        let routes = next.routes.len();
        self.app.store(Arc::new(app));
        self.settings.store(Arc::new(next));
        Ok(format!("reloaded: {routes} routes"))
    }
}

fn build_app(
    settings: &Settings,
    store: &GatewayStore,
    tokens: Option<&GatewayTokens>,
    demo_upstream: Option<&UpstreamSpec>,
) -> anyhow::Result<App> {
    let mut clients = Clients::new(
        settings.upstream_connect_timeout,
        settings.upstream_pool_max_idle,
    );
    let upstream = settings.upstream.as_ref().or(demo_upstream);
    App::with_tokens(settings, store.clone(), upstream, &mut clients, tokens)
}

/// Refuses changes a running process cannot make in place.
fn restart_only(now: &Settings, next: &Settings) -> anyhow::Result<()> {
    let admin = |s: &Settings| {
        s.admin.as_ref().map(|a| {
            (
                a.listen,
                a.token.clone(),
                a.metrics_token.clone(),
                a.tls.is_some(),
            )
        })
    };
    let checks = [
        ("listen", now.listen != next.listen),
        ("store", now.store != next.store),
        (
            "store_table / store_prefix / store_pool / store_wait_* / audit",
            now.store_options != next.store_options,
        ),
        ("store_cache_*", now.store_cache != next.store_cache),
        ("demo_upstream", now.demo_upstream != next.demo_upstream),
        ("admin", admin(now) != admin(next)),
        ("otel", now.otel != next.otel),
        ("tls (on or off)", now.tls.is_some() != next.tls.is_some()),
        ("limits", now.limits != next.limits),
        (
            "log",
            (now.log_format, &now.log_level) != (next.log_format, &next.log_level),
        ),
    ];
    for (field, changed) in checks {
        if changed {
            bail!("`{field}` changed, which needs a restart; the running configuration is kept");
        }
    }
    Ok(())
}
