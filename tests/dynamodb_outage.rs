//! DynamoDB unreachable for longer than the lease duration, then back: every connection to the
//! lease table is dropped by the fault proxy (dynalite keeps running, so the table and its rows
//! survive, as they would on the service). The readers stop once they cannot renew; nothing
//! delivered during the outage is checkpointed by the instance that lost its leases (it comes
//! again after the recovery); and after the recovery everything is delivered.

#![forbid(unsafe_code)]

mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, Publisher, ReadSettings, SharedKinesis,
    Subscription,
};
use support::proxy::{self, Fault, FaultProxy, Rule};

/// (payload, phase the consumer was in when it got it)
type Log = Arc<Mutex<Vec<(String, &'static str)>>>;

async fn wait_for(what: &str, check: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("HANG: {what} (logs in {})", support::logs_dir().display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_stop_during_a_lease_table_outage_and_everything_arrives_after_it() {
    support::init_tracing();
    let stream = support::unique_name("outage");
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let dynamodb = FaultProxy::start(&support::dynamodb_endpoint()).await;
    let store = Arc::new(
        DynamoLeaseStore::new(
            aws_sdk_dynamodb::Client::from_conf(proxy::dynamodb_config_builder(&dynamodb).build()),
            support::unique_name("outage-leases"),
        )
        .unwrap(),
    );
    let publisher = Publisher::new(api.clone(), stream.as_str());
    let subscription = Subscription::builder(api.clone(), store, stream.as_str())
        .start_at(KinesisPosition::horizon())
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .unlimited_reads(),
        )
        .list_interval(Duration::from_millis(300))
        .lease_duration(Duration::from_secs(3))
        .checkpoint_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let stop = subscription.shutdown_handle();
    let log: Log = Arc::default();
    let phase = Arc::new(Mutex::new("before"));
    let shards = Arc::new(Mutex::new(Vec::<String>::new()));
    let consumer = {
        let (log, phase, shards) = (log.clone(), phase.clone(), shards.clone());
        tokio::spawn(async move {
            let mut subscription = subscription;
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tokio::select! {
                    item = subscription.next() => match item {
                        Some(Ok(d)) => {
                            let now = *phase.lock().unwrap();
                            log.lock().unwrap().push((String::from_utf8_lossy(d.data()).into_owned(), now));
                            d.ack();
                        }
                        Some(Err(_)) => {}
                        None => break,
                    },
                    _ = tick.tick() => *shards.lock().unwrap() = subscription.shards(),
                }
            }
        })
    };
    let delivered = |log: &Log| -> HashSet<String> {
        log.lock().unwrap().iter().map(|(p, _)| p.clone()).collect()
    };

    // Before: everything flows and is checkpointed.
    for i in 0..40 {
        publisher
            .publish(format!("k{}", i % 8), format!("before-{i}"))
            .await
            .unwrap();
    }
    wait_for("the records before the outage", || {
        delivered(&log).len() >= 40
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The outage: every call to the lease table is dropped, for longer than the lease.
    *phase.lock().unwrap() = "outage";
    let outage = dynamodb.add(Rule::any(Fault::Drop));
    for i in 0..20 {
        publisher
            .publish(format!("k{}", i % 8), format!("outage-{i}"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for("the readers to stop", || shards.lock().unwrap().is_empty()).await;
    *phase.lock().unwrap() = "stopped";
    for i in 0..20 {
        publisher
            .publish(format!("k{}", i % 8), format!("stopped-{i}"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during_stop = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, phase)| *phase == "stopped")
        .count();
    assert_eq!(
        during_stop, 0,
        "a reader kept delivering after the subscription stopped reading its shards"
    );
    let delivered_in_outage: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, phase)| *phase == "outage")
        .map(|(p, _)| p.clone())
        .collect();

    // Back: the shards are taken again from their last checkpoints and everything arrives.
    dynamodb.remove(outage);
    *phase.lock().unwrap() = "after";
    for i in 0..20 {
        publisher
            .publish(format!("k{}", i % 8), format!("after-{i}"))
            .await
            .unwrap();
    }
    wait_for("every record after the recovery", || {
        delivered(&log).len() >= 100
    })
    .await;
    let after: HashSet<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, phase)| *phase == "after")
        .map(|(p, _)| p.clone())
        .collect();
    // What was delivered (and acked) while the lease table was unreachable was never
    // checkpointed: the instance lost its leases first, so those records come again.
    for payload in &delivered_in_outage {
        assert!(
            after.contains(payload),
            "{payload} was delivered during the outage and not again after it: a checkpoint \
             landed without a lease"
        );
    }
    println!(
        "outage: {} delivered before, {} during the outage (all delivered again after), 0 while \
         stopped, {} after the recovery; {} calls dropped",
        log.lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| *p == "before")
            .count(),
        delivered_in_outage.len(),
        after.len(),
        dynamodb.injected(outage)
    );
    stop.shutdown().await;
    let _ = consumer.await;
}
