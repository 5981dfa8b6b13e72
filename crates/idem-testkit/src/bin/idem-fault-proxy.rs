//! The TCP fault proxy as a process, for client tests in other languages (the Python and
//! TypeScript SDKs drive it over stdin).
//!
//! ```text
//! idem-fault-proxy --target 127.0.0.1:8080 [--posts]
//! ```
//!
//! It prints `listening on ADDR`, then reads one command per line on stdin and answers each
//! with one line:
//!
//! | command | effect | answer |
//! |---|---|---|
//! | `pass`, `drop-after-answer`, `reset-before-sending`, `delay MS` | appends that fault to the plan | `ok` |
//! | `applied` | lists the faults applied so far | `applied: f1,f2,…` |
//! | `settled` | waits (up to 10 s) until delayed requests reached the server | `settled` or `busy` |
//!
//! With `--posts` only `POST` requests take faults; others pass. It exits when stdin closes.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use idem_testkit::fault_proxy::{self, Fault, FaultProxy};

fn parse(command: &str) -> Option<Fault> {
    let mut words = command.split_whitespace();
    let fault = match (words.next()?, words.next()) {
        ("pass", None) => Fault::Pass,
        ("drop-after-answer", None) => Fault::DropAfterAnswer,
        ("reset-before-sending", None) => Fault::ResetBeforeSending,
        ("delay", Some(ms)) => Fault::Delay(Duration::from_millis(ms.parse().ok()?)),
        _ => return None,
    };
    words.next().is_none().then_some(fault)
}

fn name(fault: &Fault) -> String {
    match fault {
        Fault::Pass => "pass".into(),
        Fault::DropAfterAnswer => "drop-after-answer".into(),
        Fault::ResetBeforeSending => "reset-before-sending".into(),
        Fault::Delay(d) => format!("delay {}", d.as_millis()),
        other => format!("{other:?}"),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = args
        .iter()
        .position(|a| a == "--target")
        .and_then(|i| args.get(i + 1))
        .and_then(|t| t.parse::<SocketAddr>().ok());
    let Some(target) = target else {
        eprintln!("usage: idem-fault-proxy --target HOST:PORT [--posts]");
        return ExitCode::from(2);
    };
    let matcher: fault_proxy::Matcher = if args.iter().any(|a| a == "--posts") {
        fault_proxy::posts
    } else {
        fault_proxy::any
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let proxy = match FaultProxy::start_matching(target, matcher, []).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: cannot listen: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("listening on {}", proxy.addr());
        // Stdin is read on a thread of its own: the runtime has no async stdin here.
        let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = lines.recv().await {
            let command = line.trim();
            match command {
                "" => continue,
                "applied" => {
                    let applied: Vec<String> = proxy.applied().await.iter().map(name).collect();
                    println!("applied: {}", applied.join(","));
                }
                "settled" => {
                    let done = proxy.settled(Duration::from_secs(10)).await;
                    println!("{}", if done { "settled" } else { "busy" });
                }
                other => match parse(other) {
                    Some(fault) => {
                        proxy.push([fault]).await;
                        println!("ok");
                    }
                    None => println!("error: unknown command `{other}`"),
                },
            }
        }
        ExitCode::SUCCESS
    })
}
