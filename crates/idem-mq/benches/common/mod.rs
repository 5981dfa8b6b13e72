//! What the idem-mq benches share: how a run is sized.

/// The messages per run (the first numeric argument, default 2000) and the rounds
/// (`IDEM_BENCH_ROUNDS`, default 3).
pub(crate) fn messages_and_rounds() -> (usize, usize) {
    let n = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let rounds = std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    (n, rounds)
}
