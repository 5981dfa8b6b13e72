//! The gRPC layer's cost on a trivial unary handler, against the same server without the
//! layer, in the same run: fresh keys (claim, handler, store) and replays (one claim
//! answered from the memory store).
//!
//! `cargo bench -p idem-grpc --bench layer`. Environment: `IDEM_BENCH_ROUNDS` (default 5),
//! `IDEM_BENCH_SECS` per case and round (default 2), `IDEM_BENCH_CONC` concurrent callers
//! (default 32, over 4 HTTP/2 connections). Every round measures the three cases in a
//! rotating order; each ratio is the median of the per-round ratios (layered calls per
//! second ÷ plain calls per second in that round), with the range of the rounds.
//! Client and servers share the process (and the machine's cores). On a machine shared with
//! other work the throughput ratios are noisy, so each case also reports the process's CPU
//! time per call (user + system, from `/proc/self/stat`): the CPU ratio is plain CPU per call ÷
//! layered CPU per call, the throughput ratio a CPU-bound server would reach.
//!
//! `cargo test --all-targets` runs this binary without `--bench`: it then makes one short
//! round as a smoke test, and measures nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Engine, MemoryStore, Policy};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, MethodConfig};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod pb {
    include!(concat!(env!("OUT_DIR"), "/idem.test.v1.rs"));
}

use pb::payments_client::PaymentsClient;
use pb::payments_server::{Payments, PaymentsServer};
use pb::{ChargeReply, ChargeRequest, Order};

/// A trivial handler: echoes the amount.
struct Trivial;

#[tonic::async_trait]
impl Payments for Trivial {
    async fn charge(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        Ok(Response::new(ChargeReply {
            execution: 1,
            amount: req.get_ref().amount,
            padding: Vec::new(),
        }))
    }

    async fn echo(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        self.charge(req).await
    }

    type WatchStream = tokio_stream::Iter<std::vec::IntoIter<Result<ChargeReply, Status>>>;

    async fn watch(
        &self,
        _req: Request<ChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(tokio_stream::iter(Vec::new())))
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn start(layer: Option<GrpcIdempotencyLayer<MemoryStore>>) -> Vec<PaymentsClient<Channel>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    match layer {
        Some(layer) => {
            let router = Server::builder()
                .layer(layer)
                .add_service(PaymentsServer::new(Trivial));
            tokio::spawn(router.serve_with_incoming(incoming));
        }
        None => {
            let router = Server::builder().add_service(PaymentsServer::new(Trivial));
            tokio::spawn(router.serve_with_incoming(incoming));
        }
    }
    let mut clients = Vec::new();
    for _ in 0..4 {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        clients.push(PaymentsClient::new(channel));
    }
    clients
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Case {
    Plain,
    Fresh,
    Replay,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// CPU time used by this process so far (user + system), in clock ticks; 0 where
/// `/proc/self/stat` cannot be read.
fn cpu_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // Fields after the command name (which may hold spaces) start at field 3; utime and
    // stime are fields 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    tick(11) + tick(12)
}

/// Calls per second with `conc` callers for `secs`, and CPU ticks per thousand calls.
async fn measure(
    clients: &[PaymentsClient<Channel>],
    case: Case,
    conc: u64,
    secs: Duration,
) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..conc {
        let mut client = clients[t as usize % clients.len()].clone();
        let stop = Arc::clone(&stop);
        tasks.spawn(async move {
            let msg = ChargeRequest {
                order: Some(Order {
                    id: "order-1".into(),
                    version: 1,
                }),
                amount: 100,
                ..ChargeRequest::default()
            };
            let replay_key = format!("replay-{t}");
            let mut calls = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = match case {
                    Case::Replay => replay_key.clone(),
                    _ => format!("k-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
                };
                let mut req = Request::new(msg.clone());
                req.metadata_mut()
                    .insert("idempotency-key", key.parse().expect("ascii"));
                if client.charge(req).await.is_ok() {
                    calls += 1;
                }
            }
            calls
        });
    }
    let started = Instant::now();
    let cpu = cpu_ticks();
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n.expect("join");
    }
    let ticks = cpu_ticks().saturating_sub(cpu) as f64;
    (
        total as f64 / started.elapsed().as_secs_f64(),
        ticks * 1000.0 / total.max(1) as f64,
    )
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (mid, v[0], v[v.len() - 1])
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (rounds, secs, conc) = if bench {
        (
            env("IDEM_BENCH_ROUNDS", 5).max(1),
            Duration::from_secs(env("IDEM_BENCH_SECS", 2).max(1)),
            env("IDEM_BENCH_CONC", 32).max(1),
        )
    } else {
        (1, Duration::from_millis(200), 4)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let engine = Engine::new(MemoryStore::new(1_000_000), Policy::default());
        let config = GrpcIdempotencyConfig::new()
            .method(
                "/idem.test.v1.Payments/Charge",
                MethodConfig::new("bench.charge").expect("namespace"),
            )
            .expect("path");
        let plain = start(None).await;
        let layered = start(Some(GrpcIdempotencyLayer::new(&engine, config))).await;
        // Warm up both servers and complete the replay keys once.
        let warm = if bench { Duration::from_secs(1) } else { secs };
        measure(&plain, Case::Plain, conc, warm).await;
        measure(&layered, Case::Replay, conc, warm).await;
        measure(&layered, Case::Fresh, conc, warm).await;

        let (mut fresh, mut replay, mut rates) = (Vec::new(), Vec::new(), Vec::new());
        let (mut fresh_cpu, mut replay_cpu) = (Vec::new(), Vec::new());
        let order = [Case::Plain, Case::Fresh, Case::Replay];
        for round in 0..rounds as usize {
            let mut got = [0.0; 3];
            let mut cpu = [0.0; 3];
            for i in 0..3 {
                let case = order[(round + i) % 3];
                let clients = if case == Case::Plain { &plain } else { &layered };
                let at = order.iter().position(|c| *c == case).expect("case");
                (got[at], cpu[at]) = measure(clients, case, conc, secs).await;
            }
            eprintln!(
                "round {}: plain {:.0}/s, fresh {:.0}/s ({:.2}; cpu {:.2}), replay {:.0}/s ({:.2}; cpu {:.2})",
                round + 1,
                got[0],
                got[1],
                got[1] / got[0],
                cpu[0] / cpu[1],
                got[2],
                got[2] / got[0],
                cpu[0] / cpu[2],
            );
            fresh.push(got[1] / got[0]);
            replay.push(got[2] / got[0]);
            fresh_cpu.push(cpu[0] / cpu[1]);
            replay_cpu.push(cpu[0] / cpu[2]);
            rates.push(got);
        }
        let (f, f_lo, f_hi) = median(fresh);
        let (r, r_lo, r_hi) = median(replay);
        let (p, _, _) = median(rates.iter().map(|g| g[0]).collect());
        let (pf, _, _) = median(rates.iter().map(|g| g[1]).collect());
        let (pr, _, _) = median(rates.iter().map(|g| g[2]).collect());
        assert!(p > 0.0 && pf > 0.0 && pr > 0.0, "every case made calls");
        println!(
            "grpc layer, c={conc}, {rounds} rounds of {secs:?}: plain {p:.0}/s; fresh keys {f:.2} [{f_lo:.2}-{f_hi:.2}] ({pf:.0}/s); replays {r:.2} [{r_lo:.2}-{r_hi:.2}] ({pr:.0}/s)"
        );
        let (fc, fc_lo, fc_hi) = median(fresh_cpu);
        let (rc, rc_lo, rc_hi) = median(replay_cpu);
        println!(
            "grpc layer, CPU per call (plain / layered): fresh keys {fc:.2} [{fc_lo:.2}-{fc_hi:.2}]; replays {rc:.2} [{rc_lo:.2}-{rc_hi:.2}]"
        );
    });
}
