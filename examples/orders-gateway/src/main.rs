//! Runs the orders service behind the idem gateway on PostgreSQL and shows the three lines of
//! defence: `cargo run -p orders-gateway` (env `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use orders_gateway::demo::{self, DATABASE_URL, Rig};
use orders_gateway::service::{Guards, Verdict};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DATABASE_URL.to_owned());
    let rig = Rig::start(&url, Guards::All, 3).await?;

    println!("1. claim: five concurrent duplicates of one payment through the gateway");
    let answers = demo::duplicates(&rig, 1, "pay-order-1", 5).await?;
    for a in &answers {
        println!("   {} replayed={} {}", a.status, a.replayed, a.body);
    }
    println!("   payments of order 1: {}", rig.orders.payments(1).await?);

    println!("2. state machine: the same order paid again under another key");
    let again = rig.pay(1, "pay-order-1-again").await?;
    if let Some(a) = again.last() {
        println!("   {} {}", a.status, a.body);
    }
    println!("   payments of order 1: {}", rig.orders.payments(1).await?);

    println!(
        "3. fence: a slow first attempt times out, the gateway re-runs it, the late write lands"
    );
    let seen = demo::re_executed(&rig, 2, "pay-order-2").await?;
    for a in &seen {
        println!("   client saw {} {}", a.status, a.body);
    }
    for attempt in rig.orders.attempts().iter().filter(|a| a.order == 2) {
        let what = match attempt.verdict {
            Verdict::StaleFence => "refused by the fence",
            Verdict::Paid => "paid",
            Verdict::AlreadyPaidUnderKey => "answered with the key's payment",
            Verdict::AlreadyPaid => "refused by the state machine",
        };
        println!("   service: fence {} {what}", attempt.fence);
    }
    println!("   payments of order 2: {}", rig.orders.payments(2).await?);

    let unguarded = Rig::start(&url, Guards::None, 1).await?;
    demo::re_executed(&unguarded, 1, "pay-order-1").await?;
    println!(
        "   the same without the service's guards: {} payments",
        unguarded.orders.payments(1).await?
    );
    unguarded.clean_up().await?;
    rig.clean_up().await?;
    Ok(())
}
