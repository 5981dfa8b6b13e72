//! The idem-testkit conformance suite, race tests and model test against a private 3-master
//! Redis Cluster that this test binary creates on spare loopback ports. The cluster is shared
//! by every test here and torn down when the process exits (see `common::shared_cluster`).

mod common;

idem_testkit::conformance_tests!(
    match common::RedisHarness::cluster().await {
        Some(h) => h,
        None => return,
    },
    cases = 24,
);

/// Records spread over the cluster's slots, and `list` finds them on every master.
#[tokio::test]
async fn records_spread_over_masters_and_list_sees_them_all() {
    use idem_core::{Key, ListFilter, Scope, ScopedKey, Store};
    use idem_testkit::requests::claim_request;

    let Some(h) = common::RedisHarness::cluster().await else {
        return;
    };
    let store = idem_testkit::Harness::store(&h).await;
    let scope = Scope::new("cluster.spread").expect("ns");
    for i in 0..60 {
        let req = claim_request(ScopedKey::new(
            scope.clone(),
            Key::new(format!("k{i}")).expect("key"),
        ));
        store.claim(&req).await.expect("claim");
    }
    let cluster = common::shared_cluster();
    let per_node: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).and_then(|s| s.parse().ok()).unwrap_or(0))
        .collect();
    assert!(
        per_node.iter().all(|&n| n > 0),
        "every master holds records: {per_node:?}"
    );
    let listed = store
        .list(&ListFilter {
            namespace: Some("cluster.spread".into()),
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 60);
}

/// Durability mode on a cluster: `WAIT` runs on the master that owns the key's slot; this
/// cluster has no replicas, so the claim is uncertain and given back.
#[tokio::test]
async fn durability_wait_runs_on_the_keys_master() {
    use idem_core::{Key, Scope, ScopedKey, Store, StoreError};
    use idem_testkit::requests::claim_request;
    use std::time::Duration;

    if common::RedisHarness::cluster().await.is_none() {
        return;
    }
    let url = common::shared_cluster().url();
    let config = idem_redis::RedisConfig::from_url(&url)
        .and_then(|c| c.prefix(common::unique_prefix()))
        .and_then(|c| c.durability(1, Duration::from_millis(50)))
        .expect("config");
    let store = idem_redis::RedisStore::connect(config)
        .await
        .expect("connect");
    let key = ScopedKey::new(
        Scope::new("cluster.durable").expect("ns"),
        Key::new("k").expect("key"),
    );
    let req = claim_request(key.clone());
    let result = store.claim(&req).await;
    assert!(
        matches!(
            result,
            Err(StoreError::Uncertain {
                acked: 0,
                wanted: 1
            })
        ),
        "got {result:?}"
    );
    assert_eq!(
        store.get(&key).await.expect("get"),
        None,
        "the uncertain claim was given back"
    );
}
