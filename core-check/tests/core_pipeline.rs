//! The core's pipeline example, built with the broker face off: `map` / `filter` / `.chunks()`
//! into the ack sink on the in-memory transport; every large payment is handed on once, each
//! account's in order.

#[allow(dead_code)]
mod example {
    include!("../../examples/core_pipeline.rs");
}

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kinesis_dataflow::{
    KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings, Subscription,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_runs_without_the_broker_face() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("payments", 2).unwrap();
    let mut large: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for i in 0..40u32 {
        let (account, amount) = (format!("account-{}", i % 5), (i * 37) % 100);
        kinesis
            .put("payments", &account, format!("{i}:{amount}"))
            .unwrap();
        if amount >= example::LARGE {
            large.entry(account).or_default().push(i);
        }
    }
    let expected: usize = large.values().map(Vec::len).sum();
    let subscription = Subscription::builder(
        Arc::new(kinesis),
        Arc::new(MemoryLeaseStore::new()),
        "payments",
    )
    .start_at(KinesisPosition::horizon())
    .read_settings(ReadSettings::default().poll_interval(Duration::from_millis(50)))
    .start()
    .await
    .unwrap();
    let stop = subscription.shutdown_handle();
    let handed_on = Arc::new(Mutex::new(Vec::new()));
    let sink = handed_on.clone();
    let running = tokio::spawn(example::pipeline(subscription, move |batch| {
        sink.lock().unwrap().extend(batch);
    }));
    tokio::time::timeout(Duration::from_secs(30), async {
        while handed_on.lock().unwrap().len() < expected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every large payment is handed on");
    stop.shutdown().await;
    running
        .await
        .unwrap()
        .expect("the pipeline ends with its checkpoints written");
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (id, _) in handed_on.lock().unwrap().iter() {
        let i: u32 = id.parse().unwrap();
        seen.entry(format!("account-{}", i % 5))
            .or_default()
            .push(i);
    }
    assert_eq!(
        seen, large,
        "each large payment once, each account's in order"
    );
}
