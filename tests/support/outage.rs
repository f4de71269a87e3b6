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
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{AwsKinesis, KinesisPosition, Publisher, ReadSettings, Subscription};
use tokio::task::JoinHandle;

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

/// The subscription under test, its consumer task logging each delivery with the phase it
/// came in, and a publisher to its stream.
struct Run {
    publisher: Publisher,
    log: Log,
    phase: Arc<Mutex<&'static str>>,
    /// The shards the subscription reads, as of its last tick.
    shards: Arc<Mutex<Vec<String>>>,
    stop: ShutdownHandle,
    consumer: JoinHandle<()>,
}

impl Run {
    /// A 2-shard stream and a subscription on it with its leases in `store`, read from the
    /// start in phase "before".
    async fn start(label: &str, store: SharedLeaseStore) -> Self {
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
        let consumer = tokio::spawn(consume(
            subscription,
            log.clone(),
            phase.clone(),
            shards.clone(),
        ));
        Self {
            publisher,
            log,
            phase,
            shards,
            stop,
            consumer,
        }
    }

    fn set_phase(&self, phase: &'static str) {
        *self.phase.lock().unwrap() = phase;
    }

    /// Publishes `{prefix}-0` .. `{prefix}-{count - 1}` over 8 keys, waiting `gap` after each.
    async fn publish(&self, prefix: &str, count: usize, gap: Option<Duration>) {
        for i in 0..count {
            self.publisher
                .publish(format!("k{}", i % 8), format!("{prefix}-{i}"))
                .await
                .unwrap();
            if let Some(gap) = gap {
                tokio::time::sleep(gap).await;
            }
        }
    }

    /// The distinct payloads delivered so far.
    fn delivered(&self) -> HashSet<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// The payloads delivered in `phase`, in delivery order.
    fn delivered_in(&self, phase: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| *p == phase)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Before: everything flows and is checkpointed.
    async fn everything_flows_before_the_outage(&self) {
        self.publish("before", 40, None).await;
        wait_for("the records before the outage", || {
            self.delivered().len() >= 40
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// Records published during the outage, until the readers stop (they cannot renew).
    async fn the_readers_stop_during_the_outage(&self) {
        self.publish("outage", 20, Some(Duration::from_millis(50)))
            .await;
        wait_for("the readers to stop", || {
            self.shards.lock().unwrap().is_empty()
        })
        .await;
    }

    /// Nothing is delivered while the readers are stopped.
    async fn nothing_is_delivered_while_stopped(&self) {
        self.set_phase("stopped");
        self.publish("stopped", 20, None).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let during_stop = self.delivered_in("stopped").len();
        assert_eq!(
            during_stop, 0,
            "a reader kept delivering after the subscription stopped reading its shards"
        );
    }

    /// Back: the shards are taken again from their last checkpoints and everything arrives.
    async fn everything_arrives_after_the_recovery(&self) {
        self.set_phase("after");
        self.publish("after", 20, None).await;
        wait_for("every record after the recovery", || {
            self.delivered().len() >= 100
        })
        .await;
    }

    /// What was delivered (and acked) while the lease table was unreachable was never
    /// checkpointed: the instance lost its leases first, so those records come again.
    fn assert_delivered_again_after(&self, delivered_in_outage: &[String]) -> HashSet<String> {
        let after: HashSet<String> = self.delivered_in("after").into_iter().collect();
        for payload in delivered_in_outage {
            assert!(
                after.contains(payload),
                "{payload} was delivered during the outage and not again after it: a checkpoint \
                 landed without a lease"
            );
        }
        after
    }

    async fn shutdown(self) {
        self.stop.shutdown().await;
        let _ = self.consumer.await;
    }
}

/// The consumer: logs and acks every delivery with the phase it came in, and notes the shards
/// the subscription reads every 20 ms.
async fn consume(
    mut subscription: Subscription,
    log: Log,
    phase: Arc<Mutex<&'static str>>,
    shards: Arc<Mutex<Vec<String>>>,
) {
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
    let run = Run::start(label, store).await;
    run.everything_flows_before_the_outage().await;
    // The outage: every call to the lease table fails, for longer than the lease.
    run.set_phase("outage");
    go_down.await;
    run.the_readers_stop_during_the_outage().await;
    run.nothing_is_delivered_while_stopped().await;
    let delivered_in_outage = run.delivered_in("outage");
    come_back.await;
    run.everything_arrives_after_the_recovery().await;
    let after = run.assert_delivered_again_after(&delivered_in_outage);
    println!(
        "{label}: {} delivered before, {} during the outage (all delivered again after), 0 \
         while stopped, {} after the recovery",
        run.delivered_in("before").len(),
        delivered_in_outage.len(),
        after.len(),
    );
    run.shutdown().await;
}
