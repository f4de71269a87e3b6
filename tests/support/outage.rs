//! A lease-table outage longer than the lease duration, the scenario shared by
//! `tests/dynamodb_outage.rs` (every connection dropped by the fault proxy) and
//! `tests/dynamodb_restart.rs` (dynalite stopped and started again from its data directory).
//!
//! One subscription reads a 2-shard stream with its leases in `store`; records flow before,
//! during and after the outage. The readers must stop once they cannot renew (nothing is
//! delivered while they are stopped); what was delivered during the outage before they stopped
//! must come again after it (so none of its checkpoints landed without a lease); and after the
//! recovery every record arrives.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::{AwsKinesis, KinesisPosition, Publisher, ReadSettings, Subscription};

/// (payload, phase the consumer was in when it got it)
type Log = Arc<Mutex<Vec<(String, &'static str)>>>;

/// Polls `check` every 50 ms; panics after 60 s.
async fn wait_for(what: &str, check: impl Fn() -> bool) {
    super::wait_for(
        what,
        Duration::from_secs(60),
        Duration::from_millis(50),
        check,
    )
    .await
    .unwrap_or_else(|e| panic!("HANG: {e} (logs in {})", super::logs_dir().display()));
}

/// Runs the scenario: `go_down` starts the outage, `come_back` ends it. Prints the figures
/// under `label`.
pub async fn lease_table_outage(
    label: &str,
    store: SharedLeaseStore,
    go_down: impl Future<Output = ()>,
    come_back: impl Future<Output = ()>,
) {
    super::init_tracing();
    let stream = super::unique_name(label);
    super::create_stream(&super::kinesis_client(), &stream, 2).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(super::kinesis_client()));
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
    go_down.await;
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
    come_back.await;
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
        "{label}: {} delivered before, {} during the outage (all delivered again after), 0 \
         while stopped, {} after the recovery",
        log.lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| *p == "before")
            .count(),
        delivered_in_outage.len(),
        after.len(),
    );
    stop.shutdown().await;
    let _ = consumer.await;
}
