//! The example end to end on the local PostgreSQL: the gateway's claim, the service's state
//! machine, and its fenced write refusing a re-executed request's late effect; and the same
//! re-execution against the service without its guards, which pays twice.

use orders_gateway::demo::{self, DATABASE_URL, Rig};
use orders_gateway::service::{Guards, Verdict};

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DATABASE_URL.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_lines_hold_behind_the_gateway() {
    let rig = Rig::start(&database_url(), Guards::All, 3)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (run .ci/ensure-services)");

    // 1. The claim: five duplicates, one payment, the same answer for all.
    let answers = demo::duplicates(&rig, 1, "pay-order-1", 5)
        .await
        .expect("pay");
    assert!(answers.iter().all(|a| a.status == 201), "{answers:?}");
    assert!(
        answers.windows(2).all(|w| w[0].body == w[1].body),
        "{answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|a| !a.replayed).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(rig.orders.payments(1).await.expect("count"), 1);

    // 2. The state machine: another key for the paid order is refused by the service.
    let again = rig.pay(1, "pay-order-1-again").await.expect("pay");
    let last = again.last().expect("an answer");
    assert_eq!(last.status, 409, "{again:?}");
    assert!(last.body.contains("already-paid"), "{again:?}");
    assert_eq!(rig.orders.payments(1).await.expect("count"), 1);

    // 3. The fence: the gateway timed out the first attempt and ran the client's retry with a
    // higher fence; the first attempt's late write was refused by the fenced write.
    let seen = demo::re_executed(&rig, 2, "pay-order-2")
        .await
        .expect("pay");
    assert_eq!(seen.first().map(|a| a.status), Some(504), "{seen:?}");
    assert_eq!(seen.last().map(|a| a.status), Some(201), "{seen:?}");
    let attempts: Vec<_> = rig
        .orders
        .attempts()
        .into_iter()
        .filter(|a| a.order == 2)
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0].verdict, Verdict::Paid, "{attempts:?}");
    assert_eq!(attempts[1].verdict, Verdict::StaleFence, "{attempts:?}");
    assert!(attempts[1].fence < attempts[0].fence, "{attempts:?}");
    assert_eq!(rig.orders.payments(2).await.expect("count"), 1);
    rig.clean_up().await.expect("clean up");
}

// The unguarded variant: the same re-execution against a service that trusts the gateway
// alone pays twice. This is what `check-config` warns about for `upstream_failure = "retry"`
// without `fenced_upstream = true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_services_guards_a_re_executed_request_pays_twice() {
    let rig = Rig::start(&database_url(), Guards::None, 1)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (run .ci/ensure-services)");
    let seen = demo::re_executed(&rig, 1, "pay-order-1")
        .await
        .expect("pay");
    assert_eq!(seen.first().map(|a| a.status), Some(504), "{seen:?}");
    assert_eq!(rig.orders.payments(1).await.expect("count"), 2);
    rig.clean_up().await.expect("clean up");
}
