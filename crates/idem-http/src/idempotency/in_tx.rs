//! Same-transaction mode: the claim, the handler's own writes and the completion commit in
//! one database transaction ([`idem_core::Engine::run_in_tx_owned`]).
//!
//! The layer begins the transaction and claims the key in it, hands it to the handler as a
//! [`SharedTx`] request extension, and once the handler has answered completes the key in it
//! and commits. The transaction commits exactly when the answer is kept: a response the
//! route's [`StorePolicy`](crate::StorePolicy) releases (by default a 5xx), a service error,
//! a panic or a timeout roll the handler's writes back with the claim, so a retry runs again
//! on a clean slate. A crash anywhere before the commit leaves neither; after it, the retry is
//! a replay.
//!
//! ```
//! use axum::{Extension, Router, routing::post};
//! use idem_core::{Engine, Policy, SharedTx};
//! use idem_http::{IdempotencyConfig, IdempotencyLayer};
//! use idem_sql::SqliteStore;
//!
//! type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;
//!
//! async fn pay(Extension(tx): Extension<SharedTx<Tx>>) -> &'static str {
//!     let Some(mut tx) = tx.lock().await else { return "late" };
//!     // Writes on `&mut **tx` commit with the key, or not at all.
//!     let _ = sqlx::query("SELECT 1").execute(&mut **tx).await;
//!     "paid"
//! }
//!
//! # async fn app(store: SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(store, Policy::default());
//! let layer = IdempotencyLayer::new(&engine, IdempotencyConfig::new("orders.pay")?).in_transaction();
//! let app: Router = Router::new().route("/pay", post(pay).layer(layer));
//! # let _ = app; Ok(()) }
//! ```

use std::sync::Arc;

use http::{Request, Response};

use idem_core::{Action, Answer, EngineError, Outcome, Settled, Settlement, SharedTx, TxStore};
use tower::Service;

use super::{
    Handled, IncomingBody, Prepared, RunGuard, ServiceBody, Shared, Step, Wrapped, admit, answer,
    body_refused, examine, prepare_or_answer, read_body, route, settle, take_ready, with_outcome,
};
use crate::body::ResponseBody;
use crate::policy::FoundKey;

/// Same-transaction mode (see the module docs): the request carries, besides the
/// [`Lease`](idem_core::Lease) and the [`Key`](idem_core::Key), the
/// [`ScopedKey`](idem_core::ScopedKey) (to derive outbox message ids from) and the
/// transaction as a [`SharedTx`]. Chosen with
/// [`IdempotencyLayer::in_transaction`](super::IdempotencyLayer::in_transaction).
#[derive(Clone, Copy, Debug, Default)]
pub struct InTransaction;

/// [`Idempotency`](super::Idempotency) in same-transaction mode.
pub type TxIdempotency<S, St> = super::Idempotency<S, St, InTransaction>;

/// [`IdempotencyLayer`](super::IdempotencyLayer) in same-transaction mode.
pub type TxIdempotencyLayer<St> = super::IdempotencyLayer<St, InTransaction>;

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for TxIdempotency<S, St>
where
    S: Wrapped<ReqB, Response = Response<ResB>> + Clone + Send + 'static,
    St: TxStore,
    St::Tx: 'static,
    ReqB: IncomingBody,
    ResB: ServiceBody,
{
    crate::__layer_service_items!(ResB);

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = take_ready(&mut self.inner);
        route(Arc::clone(&self.shared), inner, req, protect_in_tx)
    }
}

/// What the work hands back: the answer to keep (committed) or the answer of a run that
/// rolled back.
type Ran<B, E> = Result<(Handled<B, E>, idem_core::StoredResponse), Handled<B, E>>;

async fn protect_in_tx<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    mut parts: http::request::Parts,
    body: ReqB,
    found: Option<FoundKey>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Wrapped<ReqB, Response = Response<ResB>> + Send + 'static,
    St: TxStore,
    St::Tx: 'static,
    ReqB: IncomingBody,
    ResB: ServiceBody,
{
    let config = &shared.config;
    // Held to the end of the run, which may go on in a spawned task after the client left.
    let _guard = parts.extensions.remove::<RunGuard>();
    let Prepared {
        found,
        fingerprint,
        scoped,
        request_id,
        mut req,
    } = prepare_or_answer!(config, inner, parts, body, found);
    let scoped_key = &scoped;
    let ran = shared
        .engine
        .run_in_tx_owned(
            &scoped,
            &fingerprint,
            request_id.as_deref(),
            move |tx, lease| async move {
                let tx = SharedTx::new(tx);
                let extensions = req.extensions_mut();
                extensions.insert(lease);
                extensions.insert(scoped_key.key.clone());
                extensions.insert(scoped_key.clone());
                extensions.insert(tx.clone());
                let result: Ran<ResB, S::Error> = match inner.call(req).await {
                    Err(e) => Err(Err(e)),
                    Ok(res) => {
                        // The body is read before the transaction is taken back, so nothing
                        // the response still produces can write after the commit.
                        let Settlement { output, action } =
                            settle(config, &scoped_key.key, res).await;
                        match action {
                            Action::Complete(stored) => Ok((output, stored)),
                            _ => Err(output),
                        }
                    }
                };
                (tx.take(), result)
            },
        )
        .await;
    let ran = match ran {
        // The completion was fenced, so the transaction rolled back: the handler's answer
        // describes writes that did not happen.
        Ok(Answer::Executed {
            settled: Settled::Fenced,
            ..
        }) => Err(EngineError::LeaseLost),
        other => other,
    };
    // Kept or rolled back, the caller gets the handler's answer; `answer` reads what was kept
    // from `settled`.
    let ran = ran.map(|a| a.map(|output| output.unwrap_or_else(|rolled_back| rolled_back)));
    answer(&shared, &found, ran)
}
