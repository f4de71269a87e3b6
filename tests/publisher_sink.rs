//! `Publisher::sink()`: a stream forwarded into kinesis-local in batches and in order per key;
//! refused records stopping the sink after what came before them is stored; and, on the
//! in-memory transport, a stream-to-stream pipeline whose deliveries are acked only once
//! their copies are stored, even when publishing fails; and a sink dropped mid-batch sends
//! nothing more.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::api::layer::{KinesisLayer, Layered};
use kinesis_dataflow::api::memory::{Fault, hash_key};
use kinesis_dataflow::api::{ApiFuture, KinesisApi, PutRecordsEntry, PutRecordsOutput};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::publish::RetryPolicy;
use kinesis_dataflow::{
    AwsKinesis, Delivery, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore,
    OutgoingRecord, Publisher, ReadSettings, Record, ShardStream, StartingPoint,
};

const SHARD0: &str = "shardId-000000000000";
const SHARD1: &str = "shardId-000000000001";

// ---------------------------------------------------------------------------------------------
// Helpers

/// Counts the entries of every PutRecords call: a layer over the transport.
#[derive(Default)]
struct PutSizes(Mutex<Vec<usize>>);

impl KinesisLayer for PutSizes {
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        self.0.lock().unwrap().push(entries.len());
        inner.put_records(stream, entries)
    }
}

/// kinesis-local behind a [`PutSizes`] layer.
fn local() -> (Arc<Layered<PutSizes>>, SharedKinesis) {
    let api = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let layered = Layered::new(api, PutSizes::default()).shared();
    let shared: SharedKinesis = layered.clone();
    (layered, shared)
}

fn text(data: &[u8]) -> String {
    String::from_utf8(data.to_vec()).unwrap()
}

/// Reads `n` records of `shard` from TRIM_HORIZON, then checks that no more come for a while.
async fn read_exactly(api: &SharedKinesis, stream: &str, shard: &str, n: usize) -> Vec<String> {
    let settings = ReadSettings::default()
        .poll_interval(Duration::from_millis(100))
        .unlimited_reads();
    let mut reader = ShardStream::builder(api.clone(), stream.to_owned(), shard.to_owned())
        .settings(settings)
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(60), reader.next()).await {
            Ok(Some(Ok(record))) => out.push(text(record.data())),
            other => panic!(
                "shard {shard}: expected record {} of {n}, got {other:?} (logs: {})",
                out.len() + 1,
                support::logs_dir().display()
            ),
        }
    }
    let more = tokio::time::timeout(Duration::from_secs(1), reader.next()).await;
    assert!(
        more.is_err(),
        "shard {shard}: more than {n} records: {more:?}"
    );
    out
}

/// Checks that every key's records appear in `key#0, key#1, ...` order in `texts`.
fn assert_in_order_per_key(texts: &[String]) {
    let mut next: HashMap<&str, usize> = HashMap::new();
    for t in texts {
        let (key, n) = t.rsplit_once('#').unwrap();
        let expected = next.entry(key).or_default();
        assert_eq!(n.parse::<usize>().unwrap(), *expected, "{t} out of order");
        *expected += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Against kinesis-local

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_stream_is_stored_whole_in_full_batches_and_in_order_per_key() {
    support::init_tracing();
    let (layered, api) = local();
    let stream = support::unique_name("sink-forward");
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let keys: Vec<String> = (0..10).map(|k| format!("key-{k}")).collect();
    let records: Vec<OutgoingRecord> = (0..1200)
        .map(|i| {
            let key = &keys[i % 10];
            OutgoingRecord::new(key.clone(), format!("{key}#{}", i / 10))
        })
        .collect();

    let publisher = Publisher::new(api.clone(), stream.clone());
    futures::stream::iter(records.into_iter().map(Ok))
        .forward(publisher.sink())
        .await
        .expect("forward");

    assert_eq!(
        *layered.layer().0.lock().unwrap(),
        [500, 500, 200],
        "batches as large as a call allows"
    );
    let on_shard1 = |k: &String| hash_key(k) >= 1 << 127;
    let mut all = BTreeSet::new();
    for (shard, upper) in [(SHARD0, false), (SHARD1, true)] {
        let count = 120 * keys.iter().filter(|k| on_shard1(k) == upper).count();
        let texts = read_exactly(&api, &stream, shard, count).await;
        assert_in_order_per_key(&texts);
        all.extend(texts);
    }
    assert_eq!(all.len(), 1200, "every record stored once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_fails_the_sink_after_the_records_before_it_are_stored() {
    support::init_tracing();
    let (_layered, api) = local();
    let stream = support::unique_name("sink-invalid");
    support::create_stream(&support::kinesis_client(), &stream, 1).await;

    // An empty key at position 10; the buffer is not full when it comes.
    let (taken, result) = forward_counting(Publisher::new(api.clone(), stream.clone()), |i| {
        let key = if i == 10 { "" } else { "k" };
        OutgoingRecord::new(key, format!("empty-case#{i}"))
    })
    .await;
    let Err(e @ KinesisError::InvalidRecord { index: 10, .. }) = result else {
        panic!("expected InvalidRecord of record 10, got {result:?}");
    };
    let message = e.to_string();
    for part in [
        "record 10",
        stream.as_str(),
        "partition key is empty",
        "PublishSink",
    ] {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }
    assert_eq!(
        taken, 12,
        "forward took the record after it, and nothing more"
    );

    // An oversize record at position 6 of batches of 4: one batch is in flight and two
    // records are buffered when it comes; both are stored before the error.
    let publisher = Publisher::new(api.clone(), stream.clone()).max_records_per_call(4);
    let (taken, result) = forward_counting(publisher, |i| {
        let data = if i == 6 {
            vec![b'x'; 1024 * 1024]
        } else {
            format!("big-case#{i}").into()
        };
        OutgoingRecord::new("k", data)
    })
    .await;
    let Err(
        e @ KinesisError::InvalidRecord {
            index: 6,
            size: 1_048_577,
            ..
        },
    ) = result
    else {
        panic!("expected InvalidRecord of record 6, got {result:?}");
    };
    assert!(e.to_string().contains("1 MiB"), "{e}");
    assert_eq!(taken, 8);

    let stored = read_exactly(&api, &stream, SHARD0, 16).await;
    let expected: Vec<String> = (0..10)
        .map(|i| format!("empty-case#{i}"))
        .chain((0..6).map(|i| format!("big-case#{i}")))
        .collect();
    assert_eq!(
        stored, expected,
        "everything before the refused records, in order"
    );
}

/// Forwards the records `make(0..25)` into `publisher.sink()`; returns how many the stream
/// handed out, and the result.
async fn forward_counting(
    publisher: Publisher,
    make: impl Fn(usize) -> OutgoingRecord,
) -> (usize, Result<(), KinesisError>) {
    let taken = AtomicUsize::new(0);
    let records = futures::stream::iter((0..25).map(make)).inspect(|_| {
        taken.fetch_add(1, Ordering::Relaxed);
    });
    let result = records.map(Ok).forward(publisher.sink()).await;
    (taken.into_inner(), result)
}

// ---------------------------------------------------------------------------------------------
// Dropping a sink

/// A sink dropped while its batch waits to be sent again (its first call was throttled)
/// sends nothing more: the record's delivery goes back, its newer copy is published, and the
/// abandoned one must not land after it (a reader keeping a key's last value would see the
/// stale one). With collection on (the default), off, and aggregating.
#[tokio::test(start_paused = true)]
async fn a_dropped_sink_sends_nothing_more_so_no_stale_copy_lands_after_a_newer_one() {
    use futures::SinkExt;
    use kinesis_dataflow::publish::{Aggregate, Collect};
    for way in ["collect", "without_collect", "aggregate"] {
        let memory = MemoryKinesis::new();
        memory.add_stream("orders", 1).unwrap();
        memory.inject(Fault::throttle(Operation::PutRecords).on_shard(SHARD0));
        let publisher = Publisher::new(Arc::new(memory.clone()), "orders");
        let publisher = match way {
            "collect" => publisher,
            "without_collect" => publisher.without_collect(),
            // No linger: the batch goes at once.
            _ => publisher
                .collect(Collect::default())
                .aggregate(Aggregate::default()),
        };
        let mut sink = publisher.sink();
        let sent = tokio::time::timeout(
            Duration::from_millis(10),
            sink.send(OutgoingRecord::new("k", "old")),
        )
        .await;
        assert!(sent.is_err(), "still waiting to send it again: {sent:?}");
        drop(sink);
        publisher.publish("k", "new").await.unwrap();
        // Longer than the retries of the abandoned batch would go on.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let stored: Vec<String> = memory
            .records("orders", SHARD0)
            .unwrap()
            .iter()
            .map(|r| text(r.data()))
            .collect();
        assert_eq!(stored, ["new"], "{way}");
    }
}

// ---------------------------------------------------------------------------------------------
// A stream-to-stream pipeline on the in-memory transport

const A: &str = "source";
const B: &str = "copy";
const RECORDS: usize = 400;

/// Streams A (with `RECORDS` records `key-k#n`) and B, two shards each, and a lease store.
fn pipeline_setup() -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(A, 2).unwrap();
    memory.add_stream(B, 2).unwrap();
    for i in 0..RECORDS {
        let key = format!("key-{}", i % 8);
        memory.put(A, &key, format!("{key}#{}", i / 8)).unwrap();
    }
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new())
}

fn to_outgoing(record: Record) -> OutgoingRecord {
    OutgoingRecord::new(record.partition_key(), record.data().clone())
}

/// The payloads stored in stream `stream`, per shard.
fn stored(memory: &MemoryKinesis, stream: &str) -> Vec<Vec<String>> {
    [SHARD0, SHARD1]
        .iter()
        .map(|shard| {
            let records = memory.records(stream, shard).unwrap();
            records.iter().map(|r| text(r.data())).collect()
        })
        .collect()
}

/// The records of A that A's stored checkpoints pass, without a copy in B: must be none.
async fn passed_but_not_copied(memory: &MemoryKinesis, store: &MemoryLeaseStore) -> Vec<String> {
    // The checkpoints first: B only grows, so what they pass must be in B read after.
    let leases = store.list(A).await.unwrap();
    let copied: BTreeSet<String> = stored(memory, B).concat().into_iter().collect();
    let mut missing = Vec::new();
    for lease in leases {
        let Some(Checkpoint::Sequence(seq)) = lease.checkpoint else {
            continue;
        };
        for record in memory.records(A, &lease.shard_id).unwrap() {
            let data = text(record.data());
            if !copied.contains(&data) {
                missing.push(data);
            }
            if record.sequence_number() == seq {
                break;
            }
        }
    }
    missing
}

/// Checks [`passed_but_not_copied`] every few milliseconds until `stop`; returns how many
/// looks saw a checkpoint.
fn watch(
    memory: MemoryKinesis,
    store: MemoryLeaseStore,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut saw_checkpoints = 0;
        while !stop.load(Ordering::Relaxed) {
            let missing = passed_but_not_copied(&memory, &store).await;
            assert!(
                missing.is_empty(),
                "checkpointed before stored: {missing:?}"
            );
            if store
                .list(A)
                .await
                .unwrap()
                .iter()
                .any(|l| l.checkpoint.is_some())
            {
                saw_checkpoints += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        saw_checkpoints
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_acked_only_once_their_copies_are_stored() {
    let (memory, api, store) = pipeline_setup();
    // Slow calls keep each batch in flight a while; two calls have entries throttled first.
    memory.inject(
        Fault::throttle(Operation::PutRecords)
            .on_shard(SHARD1)
            .times(2),
    );
    memory.inject(Fault::latency(Operation::PutRecords, Duration::from_millis(30)).times(u32::MAX));
    let publisher = Publisher::new(api.clone(), B)
        .max_records_per_call(50)
        .retry(RetryPolicy::default().initial_backoff(Duration::from_millis(10)));
    let sub = support::reading::fast(&api, Arc::new(store.clone()), A, "copier")
        .start_at(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(memory.clone(), store.clone(), stop.clone());

    let deliveries = sub
        .take(RECORDS)
        .map(|item| item.map(|d| d.map(to_outgoing)));
    tokio::time::timeout(
        Duration::from_secs(60),
        deliveries.forward(publisher.delivery_sink()),
    )
    .await
    .expect("the pipeline finishes")
    .expect("forward");
    handle.shutdown().await;
    stop.store(true, Ordering::Relaxed);
    assert!(
        watcher.await.unwrap() > 0,
        "the watcher saw checkpoints move"
    );

    let copies = stored(&memory, B);
    for shard in &copies {
        assert_in_order_per_key(shard);
    }
    let copied: BTreeSet<String> = copies.concat().into_iter().collect();
    let source: BTreeSet<String> = stored(&memory, A).concat().into_iter().collect();
    assert_eq!(copied, source, "every record of A is in B");
    assert_eq!(copies.concat().len(), RECORDS, "once");
    // (The stream's roster row stays after a graceful stop; it is no shard.)
    let shards = store.list(A).await.unwrap();
    for lease in shards.iter().filter(|l| !l.shard_id.starts_with("worker:")) {
        let last = memory.records(A, &lease.shard_id).unwrap().pop().unwrap();
        assert_eq!(
            lease.checkpoint,
            Some(Checkpoint::Sequence(last.sequence_number().to_owned())),
            "A's checkpoint of {} covers every record",
            lease.shard_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_publishing_fails_the_checkpoint_stays_before_what_was_not_stored() {
    let (memory, api, store) = pipeline_setup();
    // From the third call on, B's shard 1 refuses every entry; no retries. Slow answers let
    // the sink fill its buffer behind the batch in flight.
    memory.set_latency(Duration::from_millis(20));
    memory.inject(Fault::latency(Operation::PutRecords, Duration::ZERO).times(2));
    memory.inject(
        Fault::fail(Operation::PutRecords, "disk full")
            .on_shard(SHARD1)
            .times(u32::MAX),
    );
    let publisher = Publisher::new(api.clone(), B)
        .max_records_per_call(50)
        .retry(RetryPolicy::no_retries());
    let sub = support::reading::fast(&api, Arc::new(store.clone()), A, "copier")
        .start_at(KinesisPosition::horizon())
        .shutdown_timeout(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();

    let taken = Arc::new(Mutex::new(Vec::new()));
    let seen = taken.clone();
    let deliveries = sub
        .take(RECORDS)
        .map(move |item| -> Result<_, KinesisError> {
            let d: Delivery<Record> = item?;
            seen.lock().unwrap().push(text(d.data()));
            Ok(d.map(to_outgoing))
        });
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        deliveries.forward(publisher.delivery_sink()),
    )
    .await
    .expect("the pipeline stops");
    let Err(KinesisError::PublishFailed(failure)) = result else {
        panic!("expected PublishFailed, got {result:?}");
    };
    handle.shutdown().await;

    // Nothing taken is lost: each record is in B or handed back, in order, and not both.
    let taken = taken.lock().unwrap().clone();
    let copied: BTreeSet<String> = stored(&memory, B).concat().into_iter().collect();
    let handed_back: Vec<String> = failure
        .failed
        .iter()
        .map(|f| text(&f.record.data))
        .collect();
    let not_copied: Vec<String> = taken
        .iter()
        .filter(|t| !copied.contains(*t))
        .cloned()
        .collect();
    assert!(
        failure.total() > 51,
        "the failed batch of 50, then records held behind it: {}",
        failure.total()
    );
    assert_eq!(
        handed_back, not_copied,
        "the records not stored, handed back in order"
    );
    assert_eq!(failure.total(), failure.written() + handed_back.len());
    // The checkpoint of A never passes a record that is not in B.
    let missing = passed_but_not_copied(&memory, &store).await;
    assert!(
        missing.is_empty(),
        "checkpointed but not stored: {missing:?}"
    );
    // A's shard 0 goes to B's shard 0, which never fails: its records were all stored up to
    // the buffer (those of the failed batch too), so all of those were acked.
    let last_copied = memory
        .records(A, SHARD0)
        .unwrap()
        .into_iter()
        .rfind(|r| copied.contains(&text(r.data())))
        .unwrap();
    let shard0 = store.list(A).await.unwrap();
    let shard0 = shard0.iter().find(|l| l.shard_id == SHARD0).unwrap();
    assert_eq!(
        shard0.checkpoint,
        Some(Checkpoint::Sequence(
            last_copied.sequence_number().to_owned()
        )),
        "what was stored was acked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_close_returns_once_written_checkpoints_cover_every_delivery() {
    let (memory, api, store) = pipeline_setup();
    let publisher = Publisher::new(api.clone(), B).max_records_per_call(50);
    // No checkpoint is written on the interval during the test: only the close's own.
    let mut sub = support::reading::fast(&api, Arc::new(store.clone()), A, "copier")
        .checkpoint_interval(Duration::from_secs(3_600))
        .start_at(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    // The subscription runs on after the pipeline: nothing else writes its checkpoints.
    let deliveries = (&mut sub)
        .take(RECORDS)
        .map(|item| item.map(|d| d.map(to_outgoing)));
    tokio::time::timeout(
        Duration::from_secs(60),
        deliveries.forward(publisher.delivery_sink()),
    )
    .await
    .expect("the pipeline finishes")
    .expect("forward");

    // Right after the close, before any stop: A's checkpoints pass every record, all in B.
    let leases = store.list(A).await.unwrap();
    for lease in leases.iter().filter(|l| !l.shard_id.starts_with("worker:")) {
        let last = memory.records(A, &lease.shard_id).unwrap().pop().unwrap();
        assert_eq!(
            lease.checkpoint,
            Some(Checkpoint::Sequence(last.sequence_number().to_owned())),
            "the close waited for {}'s checkpoint",
            lease.shard_id
        );
    }
    assert_eq!(stored(&memory, B).concat().len(), RECORDS);
    handle.shutdown().await;
    drop(sub);
}
