//! A fixed amount of engine work for instruction counts (callgrind), not for timing: runs
//! `COUNT` first requests (`fresh`: claim, trivial handler, complete, each on a new key) or
//! replays (`replay`: one completed key asked again) through `Engine::run` on a
//! `MemoryStore`, on a current-thread runtime. `scripts/instructions-engine.sh` runs it twice
//! per kind and takes the difference, so start-up cancels out.
//!
//! `cargo bench -p idem-core --bench instructions -- fresh 4000` runs it without callgrind.

use idem_core::{
    Answer, Engine, Fingerprint, Key, Lease, MemoryStore, Policy, Scope, ScopedKey, Settlement,
    StoredResponse,
};

async fn charge(_: Lease) -> Settlement<()> {
    Settlement::complete((), StoredResponse::new(200, "charged"))
}

fn main() {
    // `cargo bench` passes `--bench`; the kind and count are the other two arguments.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let kind = args.first().map_or("fresh", String::as_str);
    let count: usize = match args.get(1).map(|n| n.parse()) {
        None => 1000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("the count must be a whole number: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let scope = Scope::new("bench.instructions").expect("namespace");
    let fp = Fingerprint::of_bytes(1, b"amount=100&currency=eur");
    let store = MemoryStore::new(count + 16);
    let engine = Engine::new(store, Policy::default());
    let key = |name: String| ScopedKey::new(scope.clone(), Key::new(name).expect("key"));
    runtime.block_on(async {
        match kind {
            "fresh" => {
                for n in 0..count {
                    let outcome = engine.run(&key(format!("key-{n}")), &fp, charge).await;
                    assert!(matches!(outcome, Ok(Answer::Executed { .. })));
                }
            }
            "replay" => {
                let k = key("replayed".into());
                let first = engine.run(&k, &fp, charge).await;
                assert!(matches!(first, Ok(Answer::Executed { .. })));
                for _ in 0..count {
                    let outcome = engine.run(&k, &fp, charge).await;
                    assert!(matches!(outcome, Ok(Answer::Replayed(_))));
                }
            }
            other => {
                eprintln!("unknown kind {other:?}: fresh or replay");
                std::process::exit(2);
            }
        }
    });
}
