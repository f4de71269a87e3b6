//! Fault injection against kinesis-local and dynalite, through the HTTP fault proxy of
//! `support::proxy`: for each fault (5xx answers, latency, dropped connections, throttling,
//! expired iterators, lost conditional writes) a keyed workload is consumed by a
//! `Subscription` whose Kinesis and DynamoDB clients go through the proxies while the fault
//! is active for part of the run. Every test checks at-least-once delivery with per-key order:
//! nothing lost, every key's records first delivered in publish order, and any repeat being a
//! replay (a rewind that goes on in order). Duplicates are allowed and counted.
//!
//! Each run has three phases of `PER_KEY_PER_PHASE` records for each of `KEYS` partition keys
//! on a two-shard stream: the first is published before the subscription starts, the second
//! while the faults are on (they stay on until enough were injected and the first two phases
//! are delivered), the third after they are lifted. The consumer acknowledges with a small
//! lag, so deliveries are in flight when a fault strikes. The figures are printed
//! (`cargo test --test faults -- --nocapture` shows them). Waits are hang guards only; a hang
//! panics with the deliveries so far, the shards the subscription reads, the lease table as
//! read directly, and what the proxies injected and still hold.
//!
//! The last test checks the proxy itself: its error answers parse in the SDK as the errors
//! they stand for, and its rules fire as configured and deterministically for a seed.

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::config::retry::RetryConfig;
use futures::StreamExt;
use kinesis_dataflow::api::{KinesisApi, SharedKinesis};
use kinesis_dataflow::lease::{Lease, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::publish::RetryPolicy;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisError, KinesisPosition, OutgoingRecord, Publisher,
    ReadSettings, Subscription,
};
use support::proxy::{self, Fault, FaultProxy, Rule};
use tokio::task::JoinHandle;

/// Partition keys of the workload.
const KEYS: usize = 8;
/// Records per key in each of the three phases.
const PER_KEY_PER_PHASE: usize = 10;
/// How many deliveries the consumer holds unacknowledged.
const ACK_LAG: usize = 12;
/// How often the consumer acknowledges everything it holds.
const ACK_TICK: Duration = Duration::from_millis(60);
/// The second phase is published in this many slices, this far apart, while the faults are on.
const SLICES: usize = 5;
const SLICE_GAP: Duration = Duration::from_millis(150);
/// The longest any wait may take before the test is declared hung.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// The longest a graceful shutdown may take.
const SHUTDOWN_GUARD: Duration = Duration::from_secs(20);

/// One delivery as the consumer saw it, in delivery order.
#[derive(Debug, Clone)]
struct Got {
    key: usize,
    ordinal: usize,
    shard: String,
    sequence_number: String,
}

/// The subscription under test, its deliveries recorded and acknowledged.
struct Consumer {
    got: Arc<Mutex<Vec<Got>>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// The shards the subscription reads, as of its last tick.
    shards: Arc<Mutex<Vec<String>>>,
    handle: ShutdownHandle,
    task: JoinHandle<()>,
}

impl Consumer {
    async fn start(api: &SharedKinesis, store: &SharedLeaseStore, stream: &str) -> Self {
        let sub = Subscription::builder(api.clone(), store.clone(), stream)
            .owner("fault-consumer")
            .start_at(KinesisPosition::horizon())
            .read_settings(
                ReadSettings::default()
                    .poll_interval(Duration::from_millis(50))
                    .failure_backoff(Duration::from_millis(50))
                    .unlimited_reads(),
            )
            .list_interval(Duration::from_millis(300))
            .lease_duration(Duration::from_secs(3))
            .checkpoint_interval(Duration::from_millis(100))
            .shutdown_timeout(Duration::from_secs(3))
            .start()
            .await
            .expect("the subscription starts (no fault is active yet)");
        let got = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let shards = Arc::new(Mutex::new(Vec::new()));
        let handle = sub.shutdown_handle();
        let task = {
            let (got, errors, shards) = (got.clone(), errors.clone(), shards.clone());
            tokio::spawn(async move {
                let mut sub = sub;
                // Deliveries are acknowledged with a lag (the last few, and at most one tick
                // late), so some are always in flight when a fault strikes.
                let mut pending = VecDeque::new();
                let mut tick = tokio::time::interval(ACK_TICK);
                loop {
                    tokio::select! {
                        item = sub.next() => match item {
                            Some(Ok(d)) => {
                                let payload = String::from_utf8_lossy(d.data()).into_owned();
                                let (key, ordinal) = parse_payload(&payload);
                                got.lock().unwrap().push(Got {
                                    key,
                                    ordinal,
                                    shard: d.shard_id().to_owned(),
                                    sequence_number: d.sequence_number().to_owned(),
                                });
                                pending.push_back(d);
                                while pending.len() > ACK_LAG {
                                    pending.pop_front().expect("not empty").ack();
                                }
                            }
                            Some(Err(e)) => errors.lock().unwrap().push(describe(&e)),
                            None => break,
                        },
                        _ = tick.tick() => {
                            pending.drain(..).for_each(|d| drop(d.ack()));
                            *shards.lock().unwrap() = sub.shards();
                        }
                    }
                }
                pending.drain(..).for_each(|d| drop(d.ack()));
            })
        };
        Self {
            got,
            errors,
            shards,
            handle,
            task,
        }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    fn shards(&self) -> Vec<String> {
        self.shards.lock().unwrap().clone()
    }

    /// Graceful stop, under a hang guard.
    async fn shutdown(
        self,
        diagnostics: impl Fn(&[Got], &[String]) -> String,
    ) -> (Vec<Got>, Vec<String>) {
        let now = || diagnostics(&self.got(), &self.errors());
        if tokio::time::timeout(SHUTDOWN_GUARD, self.handle.shutdown())
            .await
            .is_err()
        {
            panic!(
                "HANG: the graceful shutdown did not finish within {SHUTDOWN_GUARD:?}\n{}",
                now()
            );
        }
        let (got, errors) = (self.got.clone(), self.errors.clone());
        if tokio::time::timeout(SHUTDOWN_GUARD, self.task)
            .await
            .is_err()
        {
            panic!(
                "HANG: the subscription stream did not end within {SHUTDOWN_GUARD:?} after the \
                 shutdown\n{}",
                diagnostics(&got.lock().unwrap(), &errors.lock().unwrap())
            );
        }
        let got = got.lock().unwrap().clone();
        let errors = errors.lock().unwrap().clone();
        (got, errors)
    }
}

/// An error as "Variant: message", for the figures.
fn describe(e: &KinesisError) -> String {
    let debug = format!("{e:?}");
    let variant: String = debug
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '(')
        .collect();
    format!("{variant}: {e}")
}

fn payload(key: usize, ordinal: usize) -> String {
    format!("{key}:{ordinal:05}")
}

fn parse_payload(payload: &str) -> (usize, usize) {
    let parse = || -> Option<(usize, usize)> {
        let (key, ordinal) = payload.split_once(':')?;
        Some((key.parse().ok()?, ordinal.parse().ok()?))
    };
    parse().unwrap_or_else(|| panic!("a record that is not the workload's: {payload:?}"))
}

/// Publishes ordinals `from..from + count` of every key, ordinal by ordinal.
async fn publish_ordinals(publisher: &Publisher, from: usize, count: usize) {
    let records: Vec<OutgoingRecord> = (from..from + count)
        .flat_map(|ordinal| {
            (0..KEYS)
                .map(move |key| OutgoingRecord::new(format!("key-{key}"), payload(key, ordinal)))
        })
        .collect();
    let count = records.len();
    match publisher.publish_batch(records).await {
        Ok(published) => assert_eq!(published.len(), count),
        Err(e) => panic!("publishing ordinals {from}.. failed: {e}"),
    }
}

/// What the deliveries say about loss and order.
#[derive(Debug, Default)]
struct Analysis {
    delivered: usize,
    distinct: usize,
    /// Repeats: a key going back to a record it had already delivered.
    rewinds: usize,
    lost: Vec<String>,
    disorder: Vec<String>,
}

impl Analysis {
    fn duplicates(&self) -> usize {
        self.delivered - self.distinct
    }
}

/// Checks, for each key, in delivery order:
/// * a record delivered for the first time comes right after the key's previous new record
///   (first deliveries are the publish order, without gaps);
/// * after any delivery, the next one of the key is either the following record (the key
///   goes on) or one already delivered at or before it (a replay from an earlier position):
///   a replay never jumps forward over a record;
/// * every published record was delivered.
fn analyze(got: &[Got], per_key: usize) -> Analysis {
    let mut seen = vec![vec![false; per_key]; KEYS];
    let mut frontier = [0usize; KEYS]; // first ordinal not delivered yet
    let mut previous: Vec<Option<usize>> = vec![None; KEYS];
    let mut analysis = Analysis {
        delivered: got.len(),
        ..Analysis::default()
    };
    for (at, g) in got.iter().enumerate() {
        let (key, ordinal) = (g.key, g.ordinal);
        if key >= KEYS || ordinal >= per_key {
            analysis
                .disorder
                .push(format!("delivery #{at}: unknown record {key}:{ordinal}"));
            continue;
        }
        if !seen[key][ordinal] {
            if ordinal != frontier[key] {
                analysis.disorder.push(format!(
                    "delivery #{at}: key {key} first delivered #{ordinal} while #{} was not yet \
                     delivered ({} {})",
                    frontier[key], g.shard, g.sequence_number
                ));
            }
            seen[key][ordinal] = true;
            analysis.distinct += 1;
            while frontier[key] < per_key && seen[key][frontier[key]] {
                frontier[key] += 1;
            }
        }
        if let Some(prev) = previous[key] {
            if ordinal <= prev {
                analysis.rewinds += 1;
            } else if ordinal > prev + 1 {
                analysis.disorder.push(format!(
                    "delivery #{at}: key {key} jumped from #{prev} to #{ordinal} ({} {})",
                    g.shard, g.sequence_number
                ));
            }
        }
        previous[key] = Some(ordinal);
    }
    for (key, seen) in seen.iter().enumerate() {
        let missing: Vec<usize> = (0..per_key).filter(|o| !seen[*o]).collect();
        if !missing.is_empty() {
            analysis
                .lost
                .push(format!("key {key}: {} missing {missing:?}", missing.len()));
        }
    }
    analysis
}

/// The number of distinct records delivered for ordinals below `below` of every key.
fn delivered_below(got: &[Got], below: usize) -> usize {
    let mut seen = vec![vec![false; below]; KEYS];
    let mut n = 0;
    for g in got {
        if g.key < KEYS && g.ordinal < below && !seen[g.key][g.ordinal] {
            seen[g.key][g.ordinal] = true;
            n += 1;
        }
    }
    n
}

/// Counts errors by their variant.
fn error_kinds(errors: &[String]) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for e in errors {
        let kind = e.split(':').next().unwrap_or("?").to_owned();
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

/// The lease table's rows for `stream`, one per line, read without the proxy (from a
/// synchronous diagnostics closure, so on the multi-thread runtime with `block_in_place`).
fn lease_rows(store: &DynamoLeaseStore, stream: &str) -> String {
    let leases = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(async {
            tokio::time::timeout(Duration::from_secs(5), store.list(stream)).await
        })
    });
    match leases {
        Ok(Ok(leases)) => leases
            .iter()
            .map(|l| {
                format!(
                    "    {} owner={:?} counter={} checkpoint={:?}",
                    l.shard_id, l.owner, l.counter, l.checkpoint
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Ok(Err(e)) => format!("    (cannot list the leases: {e})"),
        Err(_) => "    (listing the leases timed out)".to_owned(),
    }
}

/// Polls `check` every 50 ms; panics with `diagnostics` after [`HANG_GUARD`].
async fn wait_for(what: &str, check: impl Fn() -> bool, diagnostics: impl Fn() -> String) {
    let deadline = Instant::now() + HANG_GUARD;
    while !check() {
        if Instant::now() > deadline {
            panic!("HANG: waited {HANG_GUARD:?} for {what}\n{}", diagnostics());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One fault scenario.
#[derive(Default)]
struct Scenario {
    name: &'static str,
    seed: u64,
    /// Rules for the Kinesis proxy, active during the second phase.
    kinesis: Vec<Rule>,
    /// Rules for the DynamoDB proxy, active during the second phase.
    dynamodb: Vec<Rule>,
    /// Publish through the Kinesis proxy (its faults hit PutRecords too) instead of directly.
    publish_through_proxy: bool,
    /// Keep the SDK's own retries (standard, 3 attempts, quick backoff); off, every fault
    /// reaches the library.
    sdk_retries: bool,
    /// Faults the proxies must have injected (together) before the faults are lifted.
    min_faults: u64,
}

/// The SDK's retries of a scenario: standard (3 attempts, quick backoff) or none.
fn sdk_retries(on: bool) -> RetryConfig {
    if on {
        RetryConfig::standard()
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(10))
    } else {
        RetryConfig::disabled()
    }
}

/// A scenario's stream, proxies, clients through them, lease store and publisher.
struct Rig {
    name: &'static str,
    started: Instant,
    stream: String,
    kinesis_proxy: FaultProxy,
    dynamodb_proxy: FaultProxy,
    /// Kinesis through its proxy.
    proxied: SharedKinesis,
    /// The lease table through the DynamoDB proxy.
    store: SharedLeaseStore,
    /// The lease table read directly, for the diagnostics.
    lease_table: DynamoLeaseStore,
    publisher: Publisher,
    /// The shards the subscription reads, as of the last diagnostics.
    shards_read: Mutex<Vec<String>>,
}

impl Rig {
    /// A two-shard stream, both proxies (seeded from the scenario), the clients through them,
    /// and the publisher (through the Kinesis proxy or directly, as the scenario says).
    async fn set_up(scenario: &Scenario) -> Self {
        let started = Instant::now();
        let direct = support::kinesis_client();
        let stream = support::unique_name(scenario.name);
        support::create_stream(&direct, &stream, 2).await;
        let kinesis_proxy =
            FaultProxy::start_seeded(&support::kinesis_endpoint(), scenario.seed).await;
        let dynamodb_proxy =
            FaultProxy::start_seeded(&support::dynamodb_endpoint(), scenario.seed.wrapping_add(1))
                .await;
        let retry = sdk_retries(scenario.sdk_retries);
        let kinesis_client = aws_sdk_kinesis::Client::from_conf(
            proxy::kinesis_config_builder(&kinesis_proxy)
                .retry_config(retry.clone())
                .build(),
        );
        let dynamodb_client = aws_sdk_dynamodb::Client::from_conf(
            proxy::dynamodb_config_builder(&dynamodb_proxy)
                .retry_config(retry)
                .build(),
        );
        let proxied: SharedKinesis = Arc::new(AwsKinesis::new(kinesis_client));
        let table = support::unique_name("fault-leases");
        let store: SharedLeaseStore = Arc::new(
            DynamoLeaseStore::new(dynamodb_client, table.clone()).expect("a valid table name"),
        );
        let publish_api: SharedKinesis = if scenario.publish_through_proxy {
            proxied.clone()
        } else {
            Arc::new(AwsKinesis::new(direct))
        };
        let publisher = Publisher::new(publish_api, stream.clone()).retry(
            RetryPolicy::default()
                .max_attempts(50)
                .initial_backoff(Duration::from_millis(10))
                .max_backoff(Duration::from_millis(200)),
        );
        let lease_table =
            DynamoLeaseStore::new(support::dynamodb_client(), table).expect("a valid table name");
        Self {
            name: scenario.name,
            started,
            stream,
            kinesis_proxy,
            dynamodb_proxy,
            proxied,
            store,
            lease_table,
            publisher,
            shards_read: Mutex::new(Vec::new()),
        }
    }

    /// What a hang or a failed check prints: the deliveries, the errors, the shards read, the
    /// lease table and the proxies.
    fn diagnostics(&self, got: &[Got], errors: &[String]) -> String {
        let analysis = analyze(got, 3 * PER_KEY_PER_PHASE);
        let (kinesis_proxy, dynamodb_proxy) = (&self.kinesis_proxy, &self.dynamodb_proxy);
        format!(
            "scenario {}, stream {}, after {:?}\n  delivered {} ({} distinct), lost so \
             far: {:?}\n  disorder: {:?}\n  stream errors: {:?}\n  last errors: {:?}\n  shards \
             the subscription reads: {:?}\n  lease table (read directly):\n{}\n  kinesis proxy: \
             {}\n    in flight: {:?}\n  dynamodb proxy: {}\n    in flight: {:?}\n  emulator \
             logs: {}",
            self.name,
            self.stream,
            self.started.elapsed(),
            analysis.delivered,
            analysis.distinct,
            analysis.lost,
            analysis.disorder,
            error_kinds(errors),
            errors.iter().rev().take(5).collect::<Vec<_>>(),
            self.shards_read.lock().unwrap(),
            lease_rows(&self.lease_table, &self.stream),
            kinesis_proxy.summary(),
            kinesis_proxy.in_flight(),
            dynamodb_proxy.summary(),
            dynamodb_proxy.in_flight(),
            support::logs_dir().display()
        )
    }

    /// The diagnostics as of now.
    fn now(&self, consumer: &Consumer) -> String {
        *self.shards_read.lock().unwrap() = consumer.shards();
        self.diagnostics(&consumer.got(), &consumer.errors())
    }

    /// Phase 2: the faults are on while the next records are published and read, until
    /// enough were injected and the first two phases are delivered; then they are lifted.
    /// Returns how long they were on.
    async fn phase_under_faults(
        &self,
        consumer: &Consumer,
        kinesis: Vec<Rule>,
        dynamodb: Vec<Rule>,
        min_faults: u64,
    ) -> Duration {
        let (kinesis_proxy, dynamodb_proxy) = (&self.kinesis_proxy, &self.dynamodb_proxy);
        for rule in kinesis {
            kinesis_proxy.add(rule);
        }
        for rule in dynamodb {
            dynamodb_proxy.add(rule);
        }
        let faults_on = Instant::now();
        let slice = PER_KEY_PER_PHASE / SLICES;
        for n in 0..SLICES {
            publish_ordinals(&self.publisher, PER_KEY_PER_PHASE + n * slice, slice).await;
            tokio::time::sleep(SLICE_GAP).await;
        }
        let now = || self.now(consumer);
        wait_for(
            "the faults to be injected",
            || kinesis_proxy.total_injected() + dynamodb_proxy.total_injected() >= min_faults,
            now,
        )
        .await;
        wait_for(
            "the first two phases under the faults",
            || {
                delivered_below(&consumer.got(), 2 * PER_KEY_PER_PHASE)
                    >= 2 * PER_KEY_PER_PHASE * KEYS
            },
            now,
        )
        .await;
        kinesis_proxy.clear();
        dynamodb_proxy.clear();
        faults_on.elapsed()
    }

    /// Phase 3: the faults are lifted; everything must come through. Stops the consumer and
    /// returns what it got.
    async fn phase_after_faults(&self, consumer: Consumer) -> (Vec<Got>, Vec<String>) {
        publish_ordinals(&self.publisher, 2 * PER_KEY_PER_PHASE, PER_KEY_PER_PHASE).await;
        wait_for(
            "every record",
            || {
                delivered_below(&consumer.got(), 3 * PER_KEY_PER_PHASE)
                    >= 3 * PER_KEY_PER_PHASE * KEYS
            },
            || self.now(&consumer),
        )
        .await;
        consumer
            .shutdown(|got, errors| self.diagnostics(got, errors))
            .await
    }

    /// The run's figures: deliveries, duplicates, rewinds, shards, errors and the proxies.
    fn print_figures(&self, got: &[Got], errors: &[String], faults_for: Duration) {
        let analysis = analyze(got, 3 * PER_KEY_PER_PHASE);
        let published = 3 * PER_KEY_PER_PHASE * KEYS;
        let shards: std::collections::BTreeSet<&str> =
            got.iter().map(|g| g.shard.as_str()).collect();
        let operations = |p: &FaultProxy| {
            p.distinct_targets()
                .iter()
                .map(|t| {
                    t.rsplit_once('.')
                        .map_or(t.as_str(), |(_, op)| op)
                        .to_owned()
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        println!(
            "[faults] {}: published {published}, delivered {} ({} distinct, {} duplicates, {} \
             rewinds) from {} shards; faults on for {faults_for:?}, run {:?}\n  stream errors: \
             {:?}\n  kinesis proxy: {}\n    ops: {}\n  dynamodb proxy: {}\n    ops: {}",
            self.name,
            analysis.delivered,
            analysis.distinct,
            analysis.duplicates(),
            analysis.rewinds,
            shards.len(),
            self.started.elapsed(),
            error_kinds(errors),
            self.kinesis_proxy.summary(),
            operations(&self.kinesis_proxy),
            self.dynamodb_proxy.summary(),
            operations(&self.dynamodb_proxy),
        );
    }

    /// Nothing lost, every key in order, every record delivered, the proxies never failed to
    /// forward, and the emulators alive.
    fn assert_at_least_once_in_key_order(&self, got: &[Got], errors: &[String]) {
        let name = self.name;
        let analysis = analyze(got, 3 * PER_KEY_PER_PHASE);
        let published = 3 * PER_KEY_PER_PHASE * KEYS;
        let report = || self.diagnostics(got, errors);
        assert!(
            analysis.lost.is_empty(),
            "LOST records under {name}: {:?}\n{}",
            analysis.lost,
            report()
        );
        assert!(
            analysis.disorder.is_empty(),
            "key ORDER broken under {name}: {:?}\n{}",
            analysis.disorder,
            report()
        );
        assert_eq!(analysis.distinct, published, "{}", report());
        assert_eq!(
            self.kinesis_proxy.upstream_errors() + self.dynamodb_proxy.upstream_errors(),
            0,
            "the proxy itself failed to forward: {}",
            report()
        );
        support::assert_emulators_alive();
    }
}

/// Runs a scenario and checks at-least-once delivery with per-key order.
async fn run(scenario: Scenario) {
    support::init_tracing();
    let rig = Rig::set_up(&scenario).await;
    // Phase 1: published before the subscription starts; no fault yet.
    publish_ordinals(&rig.publisher, 0, PER_KEY_PER_PHASE).await;
    let consumer = Consumer::start(&rig.proxied, &rig.store, &rig.stream).await;
    let faults_for = rig
        .phase_under_faults(
            &consumer,
            scenario.kinesis,
            scenario.dynamodb,
            scenario.min_faults,
        )
        .await;
    let (got, errors) = rig.phase_after_faults(consumer).await;
    rig.print_figures(&got, &errors, faults_for);
    rig.assert_at_least_once_in_key_order(&got, &errors);
}

// ---------------------------------------------------------------------------------------------
// Kinesis faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_500_and_503_answers() {
    run(Scenario {
        name: "f-5xx",
        seed: 1,
        kinesis: vec![
            Rule::any(Fault::Status(500)).rate(0.15),
            Rule::any(Fault::Status(503)).rate(0.1),
        ],
        publish_through_proxy: true,
        min_faults: 20,
        ..Scenario::default()
    })
    .await;
}

/// More failed reads in a row than a reader allows (11): the readers stop, the leases are
/// released and taken again, and reading resumes from the checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_records_500_burst_stops_the_readers() {
    run(Scenario {
        name: "f-burst",
        seed: 2,
        kinesis: vec![Rule::on("GetRecords", Fault::Status(500)).times(30)],
        min_faults: 30,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_latency() {
    run(Scenario {
        name: "f-k-latency",
        seed: 3,
        kinesis: vec![Rule::any(Fault::Latency(Duration::from_millis(150))).rate(0.5)],
        publish_through_proxy: true,
        min_faults: 20,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_dropped_connections() {
    run(Scenario {
        name: "f-k-drop",
        seed: 4,
        kinesis: vec![
            Rule::any(Fault::Drop).rate(0.1),
            Rule::any(Fault::DropAfterForward).rate(0.1),
        ],
        publish_through_proxy: true,
        min_faults: 20,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_throttled() {
    run(Scenario {
        name: "f-k-throttle",
        seed: 5,
        kinesis: vec![Rule::any(Fault::Throttled).rate(0.4)],
        publish_through_proxy: true,
        min_faults: 20,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_iterators() {
    run(Scenario {
        name: "f-expired",
        seed: 6,
        kinesis: vec![Rule::on("GetRecords", Fault::ExpiredIterator).rate(0.25)],
        min_faults: 20,
        ..Scenario::default()
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// DynamoDB faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_500_and_503_answers() {
    run(Scenario {
        name: "f-d-5xx",
        seed: 7,
        dynamodb: vec![
            Rule::any(Fault::Status(500)).rate(0.15),
            Rule::any(Fault::Status(503)).rate(0.1),
        ],
        min_faults: 10,
        ..Scenario::default()
    })
    .await;
}

/// Some lease-table writes take longer than the coordinator's call timeout (a third of the
/// lease duration): the call is abandoned but the write still lands, so the next write with
/// the old counter fails its condition and the shard is dropped and taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_latency_beyond_the_call_timeout() {
    run(Scenario {
        name: "f-d-latency",
        seed: 8,
        dynamodb: vec![
            Rule::on("UpdateItem", Fault::Latency(Duration::from_millis(1500)))
                .rate(0.3)
                .times(4),
            Rule::any(Fault::Latency(Duration::from_millis(300))).rate(0.3),
        ],
        min_faults: 10,
        ..Scenario::default()
    })
    .await;
}

/// Lease-table writes that are slow but answer within the call timeout (900 ms against 1 s):
/// every write succeeds, yet a holder timing its lease from the last write it sent sees the
/// lease run out for a moment between two renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_slow_writes_within_the_call_timeout() {
    run(Scenario {
        name: "f-d-slow",
        seed: 14,
        dynamodb: vec![Rule::on(
            "UpdateItem",
            Fault::Latency(Duration::from_millis(900)),
        )],
        min_faults: 10,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_dropped_connections() {
    run(Scenario {
        name: "f-d-drop",
        seed: 9,
        dynamodb: vec![
            Rule::any(Fault::Drop).rate(0.1),
            Rule::any(Fault::DropAfterForward).rate(0.1),
        ],
        min_faults: 10,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_throttled() {
    run(Scenario {
        name: "f-d-throttle",
        seed: 10,
        dynamodb: vec![Rule::any(Fault::Throttled).rate(0.3)],
        min_faults: 10,
        ..Scenario::default()
    })
    .await;
}

/// Lease writes that lose a race: the condition fails, the row is left as it was. The holder
/// stops reading the shard at once and takes the lease again at the next listing, resuming
/// from the checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_conditional_check_failed() {
    run(Scenario {
        name: "f-d-ccf",
        seed: 11,
        dynamodb: vec![Rule::on("UpdateItem", Fault::ConditionalCheckFailed).rate(0.2)],
        min_faults: 8,
        ..Scenario::default()
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// With the SDK's own retries

/// The SDK's standard retries in front of the library (as most applications run it): most
/// 5xx answers are absorbed by the SDK, the rest reach the library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_retries_over_5xx_on_both_services() {
    run(Scenario {
        name: "f-sdk-retries",
        seed: 12,
        kinesis: vec![Rule::any(Fault::Status(500)).rate(0.2)],
        dynamodb: vec![Rule::any(Fault::Status(503)).rate(0.2)],
        publish_through_proxy: true,
        sdk_retries: true,
        min_faults: 20,
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Everything at once

/// Every fault of both services at once, at low rates, with slow ListShards and
/// GetShardIterator calls (past the coordinator's call timeout) on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_every_fault_on_both_services() {
    let slow = Duration::from_millis(1200);
    run(Scenario {
        name: "f-storm",
        seed: 13,
        kinesis: vec![
            Rule::on("ListShards", Fault::Latency(slow))
                .rate(0.3)
                .times(3),
            Rule::on("GetShardIterator", Fault::Latency(slow))
                .rate(0.3)
                .times(3),
            Rule::on("GetRecords", Fault::ExpiredIterator).rate(0.05),
            Rule::any(Fault::Status(500)).rate(0.04),
            Rule::any(Fault::Status(503)).rate(0.03),
            Rule::any(Fault::Drop).rate(0.03),
            Rule::any(Fault::DropAfterForward).rate(0.03),
            Rule::any(Fault::Throttled).rate(0.05),
            Rule::any(Fault::Latency(Duration::from_millis(100))).rate(0.1),
        ],
        dynamodb: vec![
            Rule::on("UpdateItem", Fault::Latency(Duration::from_millis(1500)))
                .rate(0.1)
                .times(2),
            Rule::on("UpdateItem", Fault::ConditionalCheckFailed).rate(0.05),
            Rule::any(Fault::Status(500)).rate(0.04),
            Rule::any(Fault::Status(503)).rate(0.03),
            Rule::any(Fault::Drop).rate(0.03),
            Rule::any(Fault::DropAfterForward).rate(0.03),
            Rule::any(Fault::Throttled).rate(0.05),
        ],
        publish_through_proxy: true,
        min_faults: 40,
        ..Scenario::default()
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The proxy itself

/// The proxies, clients through them (SDK retries off), and a one-shard stream with an
/// iterator of its shard, for the checks of the proxy itself.
struct Shapes {
    kp: FaultProxy,
    dp: FaultProxy,
    kinesis: aws_sdk_kinesis::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    stream: String,
    shard: &'static str,
    iterator: String,
}

impl Shapes {
    async fn set_up() -> Self {
        use aws_sdk_kinesis::types::ShardIteratorType;

        let kp = FaultProxy::start_seeded(&support::kinesis_endpoint(), 99).await;
        let dp = FaultProxy::start_seeded(&support::dynamodb_endpoint(), 99).await;
        let kinesis = aws_sdk_kinesis::Client::from_conf(
            proxy::kinesis_config_builder(&kp)
                .retry_config(RetryConfig::disabled())
                .build(),
        );
        let dynamodb = aws_sdk_dynamodb::Client::from_conf(
            proxy::dynamodb_config_builder(&dp)
                .retry_config(RetryConfig::disabled())
                .build(),
        );
        let stream = support::unique_name("f-shapes");
        support::create_stream(&kinesis, &stream, 1).await;
        let shard = "shardId-000000000000";
        let iterator = kinesis
            .get_shard_iterator()
            .stream_name(&stream)
            .shard_id(shard)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .expect("forwarded")
            .shard_iterator
            .expect("an iterator");
        Self {
            kp,
            dp,
            kinesis,
            dynamodb,
            stream,
            shard,
            iterator,
        }
    }

    /// Kinesis, through the SDK: each error answer parses as the error it stands for, a
    /// dropped connection as a transport failure.
    async fn check_kinesis_errors_through_the_sdk(&self) {
        use aws_sdk_kinesis::error::ProvideErrorMetadata;

        let Self { kp, kinesis, .. } = self;
        let iterator = &self.iterator;
        let get_records = || kinesis.get_records().shard_iterator(iterator).send();
        kp.add(Rule::on("GetRecords", Fault::ExpiredIterator).times(1));
        let e = get_records().await.unwrap_err();
        assert!(
            e.as_service_error()
                .is_some_and(|e| e.is_expired_iterator_exception()),
            "{e:?}"
        );
        kp.add(Rule::on("GetRecords", Fault::Throttled).times(1));
        let e = get_records().await.unwrap_err();
        assert!(
            e.as_service_error()
                .is_some_and(|e| e.is_provisioned_throughput_exceeded_exception()),
            "{e:?}"
        );
        for (status, code) in [(500, "InternalFailure"), (503, "ServiceUnavailable")] {
            kp.add(Rule::on("GetRecords", Fault::Status(status)).times(1));
            let e = get_records().await.unwrap_err();
            assert_eq!(e.code(), Some(code), "{e:?}");
            assert_eq!(e.raw_response().map(|r| r.status().as_u16()), Some(status));
        }
        kp.add(Rule::on("GetRecords", Fault::Drop).times(1));
        let e = get_records().await.unwrap_err();
        assert!(e.as_service_error().is_none(), "a transport failure: {e:?}");
        assert!(
            get_records().await.is_ok(),
            "forwarded once the rules ran out"
        );
    }

    /// Kinesis, through the library: each fault is classified as intended.
    async fn check_kinesis_errors_through_the_library(&self) {
        let Self {
            kp,
            kinesis,
            stream,
            shard,
            iterator,
            ..
        } = self;
        let api = AwsKinesis::new(kinesis.clone());
        let shard_id: Arc<str> = Arc::from(*shard);
        for (fault, check) in [
            (
                Fault::ExpiredIterator,
                KinesisError::is_expired_iterator as fn(&KinesisError) -> bool,
            ),
            (Fault::Throttled, KinesisError::is_throttle),
            (Fault::Status(500), |e: &KinesisError| {
                matches!(e, KinesisError::Service { .. }) && e.is_retryable()
            }),
            (Fault::DropAfterForward, |e: &KinesisError| {
                matches!(e, KinesisError::Service { .. }) && e.is_retryable()
            }),
        ] {
            kp.add(Rule::on("GetRecords", fault.clone()).times(1));
            let e = api
                .get_records(stream, &shard_id, iterator.clone(), 10)
                .await
                .unwrap_err();
            assert!(check(&e), "{} became {e:?}", fault.name());
        }
    }

    /// DynamoDB, through the SDK and the lease store: a lost conditional write. Returns the
    /// lease store (on a table of its own) for the next checks.
    async fn check_a_lost_conditional_write(&self) -> DynamoLeaseStore {
        let Self {
            dp,
            dynamodb,
            stream,
            ..
        } = self;
        let table = support::unique_name("f-shapes-leases");
        let store = DynamoLeaseStore::new(dynamodb.clone(), table.clone()).expect("a valid name");
        store.prepare().await.expect("the table is created");
        let lease = Lease::new(stream.clone(), "shard-a", Vec::new());
        assert!(store.create(&lease).await.expect("created"));
        dp.add(Rule::on("UpdateItem", Fault::ConditionalCheckFailed).times(2));
        let e = dynamodb
            .update_item()
            .table_name(&table)
            .key(
                "leaseKey",
                aws_sdk_dynamodb::types::AttributeValue::S(format!("{stream}#shard-a")),
            )
            .update_expression("SET #c = :c")
            .expression_attribute_names("#c", "leaseCounter")
            .expression_attribute_values(
                ":c",
                aws_sdk_dynamodb::types::AttributeValue::N("0".into()),
            )
            .send()
            .await
            .unwrap_err();
        assert!(
            e.as_service_error()
                .is_some_and(|e| e.is_conditional_check_failed_exception()),
            "{e:?}"
        );
        let e = store.take(&lease, "me").await.unwrap_err();
        assert!(e.is_lost(), "{e:?}");
        let untouched = store.list(stream).await.expect("listed");
        assert_eq!(
            untouched[0].owner, None,
            "a lost conditional write leaves the row"
        );
        store
    }

    /// DynamoDB: Scan and Query errors through the SDK and the lease store, and a lost answer
    /// to a write that happened.
    async fn check_dynamodb_errors(&self, store: &DynamoLeaseStore) {
        let Self {
            dp,
            dynamodb,
            stream,
            ..
        } = self;
        let table = store.table();
        dp.add(Rule::on("Scan", Fault::Throttled).times(1));
        let e = dynamodb.scan().table_name(table).send().await.unwrap_err();
        assert!(
            e.as_service_error()
                .is_some_and(|e| e.is_provisioned_throughput_exceeded_exception()),
            "{e:?}"
        );
        dp.add(Rule::on("Scan", Fault::Status(500)).times(1));
        let e = dynamodb.scan().table_name(table).send().await.unwrap_err();
        assert!(
            e.as_service_error()
                .is_some_and(|e| e.is_internal_server_error()),
            "{e:?}"
        );
        for fault in [Fault::Throttled, Fault::Status(503), Fault::Drop] {
            dp.add(Rule::on("Query", fault.clone()).times(1));
            let e = store.list(stream).await.unwrap_err();
            assert!(e.is_retryable(), "{} became {e:?}", fault.name());
        }
        // A lost answer: the write happened, the caller cannot know.
        dp.add(Rule::on("PutItem", Fault::DropAfterForward).times(1));
        let other = Lease::new(stream.clone(), "shard-b", Vec::new());
        assert!(store.create(&other).await.unwrap_err().is_retryable());
        let rows = store.list(stream).await.expect("listed");
        assert!(rows.iter().any(|l| l.shard_id == "shard-b"), "{rows:?}");
    }

    /// Counting: the first matching request passes, the next two fail, then all pass.
    async fn check_a_rule_counts_its_matches(&self) {
        let Self {
            kp,
            kinesis,
            stream,
            ..
        } = self;
        kp.add(Rule::on("ListShards", Fault::Status(500)).after(1).times(2));
        let mut outcomes = Vec::new();
        for _ in 0..4 {
            outcomes.push(
                kinesis
                    .list_shards()
                    .stream_name(stream)
                    .send()
                    .await
                    .is_ok(),
            );
        }
        assert_eq!(outcomes, [true, false, false, true]);
    }

    /// The call log holds every target.
    fn check_the_call_log(&self) {
        let Self { kp, dp, .. } = self;
        let targets = kp.distinct_targets();
        for op in [
            "CreateStream",
            "GetShardIterator",
            "GetRecords",
            "ListShards",
        ] {
            assert!(
                targets.contains(&format!("Kinesis_20131202.{op}")),
                "{targets:?}"
            );
        }
        assert_eq!(kp.count("GetRecords"), 10, "{:?}", kp.targets());
        let targets = dp.distinct_targets();
        for op in [
            "CreateTable",
            "DescribeTable",
            "PutItem",
            "Query",
            "Scan",
            "UpdateItem",
        ] {
            assert!(
                targets.contains(&format!("DynamoDB_20120810.{op}")),
                "{targets:?}"
            );
        }
        assert_eq!(kp.upstream_errors() + dp.upstream_errors(), 0);
        println!(
            "[faults] proxy shapes: kinesis proxy: {}\n  dynamodb proxy: {}",
            kp.summary(),
            dp.summary()
        );
    }
}

/// A rate is deterministic for a seed.
async fn check_a_rate_is_deterministic_for_a_seed() {
    let pattern = |seed: u64| async move {
        let p = FaultProxy::start_seeded(&support::kinesis_endpoint(), seed).await;
        let client = aws_sdk_kinesis::Client::from_conf(
            proxy::kinesis_config_builder(&p)
                .retry_config(RetryConfig::disabled())
                .build(),
        );
        p.add(Rule::any(Fault::Status(503)).rate(0.5));
        let mut failed = Vec::new();
        for _ in 0..24 {
            failed.push(client.list_streams().send().await.is_err());
        }
        failed
    };
    let (a, b, c) = (pattern(7).await, pattern(7).await, pattern(8).await);
    assert_eq!(a, b, "same seed, same faults");
    assert!(a.contains(&true) && a.contains(&false), "{a:?}");
    assert_ne!(a, c, "another seed, other faults");
}

/// The proxy's error answers are parsed by the SDK as the errors they stand for, and the
/// library classifies them as intended; rules fire as configured; the call log holds every
/// target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_answers_in_the_shapes_the_sdk_parses() {
    support::init_tracing();
    let shapes = Shapes::set_up().await;
    shapes.check_kinesis_errors_through_the_sdk().await;
    shapes.check_kinesis_errors_through_the_library().await;
    let store = shapes.check_a_lost_conditional_write().await;
    shapes.check_dynamodb_errors(&store).await;
    shapes.check_a_rule_counts_its_matches().await;
    check_a_rate_is_deterministic_for_a_seed().await;
    shapes.check_the_call_log();
}
