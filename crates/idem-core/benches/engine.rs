//! Engine + memory store throughput, against a bare insert-if-absent map in the same run.
//!
//! Run with `cargo bench -p idem-core --bench engine`; results and ratios are in
//! `docs/BENCHMARKS.md`. Every engine call is driven by `block_on` on a current-thread tokio
//! runtime owned by the bench thread; `runtime_block_on_noop` measures that overhead alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use idem_core::{
    Answer, CachedStore, Engine, Fingerprint, Key, MemoryStore, Policy, ReleaseKind, Scope,
    ScopedKey, Settlement, StoredResponse,
};

/// Records the memory store keeps, and the size at which the baseline map is cleared.
const CAPACITY: usize = 100_000;
/// Records the fresh-key bench's store keeps: more than a run sends, since a full memory store
/// refuses new keys (it never drops a live record to make room).
const FRESH_CAPACITY: usize = 10_000_000;

fn main() {
    divan::main();
    let runs = CONTENDED_RUNS.lock().expect("lock");
    for (i, (executed, in_flight)) in runs.iter().enumerate() {
        let total = (executed + in_flight).max(1);
        eprintln!(
            "contended_single_key run {} (thread counts in order 1, 2): {executed} executed, {in_flight} in flight ({:.1}% in flight)",
            i + 1,
            100.0 * *in_flight as f64 / total as f64
        );
    }
}

thread_local! {
    /// One current-thread runtime per bench thread.
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
}

fn block_on<F: Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| rt.block_on(f))
}

static SCOPE: LazyLock<Scope> = LazyLock::new(|| Scope::new("bench.engine").expect("namespace"));
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A key never used before (same construction in the engine benches and the baseline).
fn unique_key() -> ScopedKey {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ScopedKey::new(SCOPE.clone(), Key::new(format!("key-{n}")).expect("key"))
}

fn fixed_key(name: &str) -> ScopedKey {
    ScopedKey::new(SCOPE.clone(), Key::new(name).expect("key"))
}

static FP: LazyLock<Fingerprint> =
    LazyLock::new(|| Fingerprint::of_bytes(1, b"amount=100&currency=eur"));

fn engine() -> Engine<MemoryStore> {
    Engine::new(MemoryStore::new(CAPACITY), Policy::default())
}

async fn charge(_: idem_core::Lease) -> Settlement<()> {
    Settlement::complete((), StoredResponse::new(200, "charged"))
}

// ---------------------------------------------------------------------------------------
// Baseline: the least an idempotency check can do, an atomic insert-if-absent
// ---------------------------------------------------------------------------------------

static BASELINE: LazyLock<Mutex<HashMap<ScopedKey, u64>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Insert-if-absent of a fresh key into a `Mutex<HashMap<ScopedKey, _>>`.
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn baseline_insert_unique(bencher: divan::Bencher) {
    bencher.bench(|| {
        let key = unique_key();
        let mut map = BASELINE.lock().expect("lock");
        if map.len() >= CAPACITY {
            map.clear();
        }
        let n = map.len() as u64;
        *map.entry(key).or_insert(n)
    });
}

/// Insert-if-absent of a key that is already there (the replay counterpart).
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn baseline_insert_existing(bencher: divan::Bencher) {
    let key = fixed_key("baseline-existing");
    BASELINE.lock().expect("lock").insert(key.clone(), 7);
    bencher.bench(|| {
        let key = divan::black_box(&key).clone();
        *BASELINE.lock().expect("lock").entry(key).or_insert(0)
    });
}

/// The runtime overhead every engine figure below includes.
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn runtime_block_on_noop(bencher: divan::Bencher) {
    bencher.bench(|| block_on(async { divan::black_box(1) }));
}

// ---------------------------------------------------------------------------------------
// Engine + memory store
// ---------------------------------------------------------------------------------------

static FIRST: LazyLock<Engine<MemoryStore>> = LazyLock::new(|| {
    let store = MemoryStore::bounded(
        FRESH_CAPACITY,
        usize::MAX,
        idem_core::SystemClock,
        idem_core::memory::MEMORY_AUDIT,
    );
    Engine::new(store, Policy::default())
});

/// A first request: claim, run a trivial handler, complete. Unique keys.
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn first_request(bencher: divan::Bencher) {
    bencher.bench(|| {
        let key = unique_key();
        let outcome = block_on(FIRST.run(&key, &FP, charge)).expect("run");
        assert!(matches!(outcome, Answer::Executed { .. }));
    });
}

static REPLAY: LazyLock<(Engine<MemoryStore>, ScopedKey)> = LazyLock::new(|| {
    let (engine, key) = (engine(), fixed_key("replayed"));
    block_on(engine.run(&key, &FP, charge)).expect("run");
    (engine, key)
});

/// A retry of a completed key: one claim that answers with the stored response.
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn replay(bencher: divan::Bencher) {
    let (engine, key) = &*REPLAY;
    bencher.bench(|| {
        let outcome = block_on(engine.run(key, &FP, charge)).expect("run");
        assert!(matches!(outcome, Answer::Replayed(_)));
    });
}

static CACHED: LazyLock<(Engine<CachedStore<MemoryStore>>, ScopedKey)> = LazyLock::new(|| {
    let cached = CachedStore::new(MemoryStore::new(CAPACITY), 10_000, Duration::from_secs(600));
    let (engine, key) = (Engine::new(cached, Policy::default()), fixed_key("cached"));
    block_on(engine.run(&key, &FP, charge)).expect("run");
    (engine, key)
});

/// A retry of a completed key answered by the local cache tier, before the store.
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn replay_cached(bencher: divan::Bencher) {
    let (engine, key) = &*CACHED;
    bencher.bench(|| {
        let outcome = block_on(engine.run(key, &FP, charge)).expect("run");
        assert!(matches!(outcome, Answer::Replayed(_)));
    });
}

static CONTENDED: LazyLock<(Engine<MemoryStore>, ScopedKey)> =
    LazyLock::new(|| (engine(), fixed_key("contended")));
static CONTENDED_RUNS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
static EXECUTED: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

/// Every thread runs the same key, whose handler releases the claim (a failure before any
/// effect), so the key keeps cycling absent → processing → absent. One op is one `run`:
/// either it claimed, ran and released (two store operations), or it found the other
/// thread's live claim and answered "in flight" (one). `main` prints the mix.
#[divan::bench(threads = [1, 2], sample_count = 200, sample_size = 1000, max_time = 10)]
fn contended_single_key(bencher: divan::Bencher) {
    let (engine, key) = &*CONTENDED;
    let before = (
        EXECUTED.load(Ordering::Relaxed),
        IN_FLIGHT.load(Ordering::Relaxed),
    );
    bencher.bench(|| {
        let outcome = block_on(engine.run(key, &FP, |_| async {
            Settlement::release((), ReleaseKind::Retryable)
        }))
        .expect("run");
        match outcome {
            Answer::Executed { .. } => EXECUTED.fetch_add(1, Ordering::Relaxed),
            Answer::InFlight { .. } => IN_FLIGHT.fetch_add(1, Ordering::Relaxed),
            other => panic!("unexpected {other:?}"),
        };
    });
    let after = (
        EXECUTED.load(Ordering::Relaxed),
        IN_FLIGHT.load(Ordering::Relaxed),
    );
    CONTENDED_RUNS
        .lock()
        .expect("lock")
        .push((after.0 - before.0, after.1 - before.1));
}
