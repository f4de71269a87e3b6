//! The publisher: batching, validation and unknown streams against kinesis-local; retries,
//! the per-key ordering rule, exhaustion and backoff on the in-memory transport with paused
//! tokio time and injected faults.

mod support;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::api::layer::{KinesisLayer, Layered};
use kinesis_dataflow::api::memory::{Call, Fault, hash_key};
use kinesis_dataflow::api::{ApiFuture, KinesisApi, PutRecordsEntry, PutRecordsOutput};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::publish::Published;
use kinesis_dataflow::publish::{KeyOrder, RetryPolicy};
use kinesis_dataflow::{
    AwsKinesis, KinesisError, MemoryKinesis, OutgoingRecord, Publisher, ReadSettings, Record,
    ShardStream, StartingPoint,
};

const SHARD0: &str = "shardId-000000000000";
const SHARD1: &str = "shardId-000000000001";
const THROTTLED: &str = "ProvisionedThroughputExceededException";
const INTERNAL: &str = "InternalFailure";

// ---------------------------------------------------------------------------------------------
// Helpers

/// Logs the entries of every PutRecords call, and can deny calls from the n-th PutRecords
/// call on (to script a failure retrying cannot fix): a layer over the transport.
#[derive(Default)]
struct Recorder {
    puts: Mutex<Vec<Vec<PutRecordsEntry>>>,
    deny_from_call: Option<usize>,
    /// The answer of this PutRecords call (counted from 1) loses its last result.
    short_answer_on_call: Option<usize>,
}

/// A transport behind a [`Recorder`].
type Recording = Layered<Recorder>;

impl Recorder {
    fn over(inner: SharedKinesis) -> Arc<Recording> {
        Layered::new(inner, Self::default()).shared()
    }

    fn denying_from_call(inner: SharedKinesis, call: usize) -> Arc<Recording> {
        let recorder = Self {
            deny_from_call: Some(call),
            ..Self::default()
        };
        Layered::new(inner, recorder).shared()
    }

    /// The data of each PutRecords call's entries, as text.
    fn puts(&self) -> Vec<Vec<String>> {
        self.puts
            .lock()
            .unwrap()
            .iter()
            .map(|call| {
                call.iter()
                    .map(|e| String::from_utf8(e.data.to_vec()).unwrap())
                    .collect()
            })
            .collect()
    }

    fn put_sizes(&self) -> Vec<usize> {
        self.puts.lock().unwrap().iter().map(Vec::len).collect()
    }
}

impl KinesisLayer for Recorder {
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        let call = {
            let mut puts = self.puts.lock().unwrap();
            puts.push(entries.clone());
            puts.len()
        };
        if self.deny_from_call.is_some_and(|from| call >= from) {
            return Box::pin(async move {
                Err(KinesisError::AccessDenied {
                    operation: Operation::PutRecords,
                    stream: stream.to_owned(),
                    message: "not authorized to perform kinesis:PutRecords".into(),
                    source: None,
                })
            });
        }
        if self.short_answer_on_call != Some(call) {
            return inner.put_records(stream, entries);
        }
        Box::pin(async move {
            let mut out = inner.put_records(stream, entries).await?;
            out.results.pop();
            Ok(out)
        })
    }
}

/// Records `key#0`, `key#1`, ... for the keys in `keys`, cycling through them, `per_key` each.
fn records(keys: &[&str], per_key: usize) -> Vec<OutgoingRecord> {
    (0..per_key)
        .flat_map(|n| {
            keys.iter()
                .map(move |k| OutgoingRecord::new(*k, format!("{k}#{n}")))
        })
        .collect()
}

fn text(r: &Record) -> String {
    String::from_utf8(r.data().to_vec()).unwrap()
}

/// The first `n` partition keys `prefix-0`, `prefix-1`, ... that land on `shard` of a two-shard
/// stream.
fn keys_on(shard: &str, prefix: &str, n: usize) -> Vec<String> {
    let upper = shard == SHARD1;
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|k| (hash_key(k) >= 1 << 127) == upper)
        .take(n)
        .collect()
}

/// A two-shard in-memory stream behind a recording transport.
fn memory_stream(stream: &str) -> (MemoryKinesis, Arc<Recording>) {
    let memory = MemoryKinesis::new();
    memory.add_stream(stream, 2).unwrap();
    let recording = Recorder::over(Arc::new(memory.clone()));
    (memory, recording)
}

fn stored(memory: &MemoryKinesis, stream: &str, shard: &str) -> Vec<String> {
    memory
        .records(stream, shard)
        .unwrap()
        .iter()
        .map(text)
        .collect()
}

fn put_calls(memory: &MemoryKinesis) -> Vec<Call> {
    memory
        .calls()
        .into_iter()
        .filter(|c| c.operation == Operation::PutRecords)
        .collect()
}

fn gaps(calls: &[Call]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1].at - w[0].at).collect()
}

/// Checks that every key's records appear in `key#0, key#1, ...` order in `texts`.
fn assert_in_order_per_key(texts: &[String]) {
    let mut next: HashMap<&str, usize> = HashMap::new();
    for t in texts {
        let (key, n) = t.rsplit_once('#').unwrap();
        let expected = next.entry(key).or_default();
        assert_eq!(
            n.parse::<usize>().unwrap(),
            *expected,
            "record {t} is out of order for key {key}: {texts:?}"
        );
        *expected += 1;
    }
}

fn failure(
    result: Result<Vec<Published>, KinesisError>,
) -> kinesis_dataflow::publish::PublishFailure {
    match result {
        Err(KinesisError::PublishFailed(failure)) => *failure,
        other => panic!("expected PublishFailed, got {other:?}"),
    }
}

/// A tracing writer into a shared buffer, to check the publisher's events.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Captures the events of this thread at `level` and above until the guard drops.
fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

// ---------------------------------------------------------------------------------------------
// Against kinesis-local

fn local() -> (Arc<Recording>, SharedKinesis) {
    let recording = Recorder::over(Arc::new(AwsKinesis::new(support::kinesis_client())));
    let shared: SharedKinesis = recording.clone();
    (recording, shared)
}

async fn read_shard(api: &SharedKinesis, stream: &str, shard: &str, n: usize) -> Vec<Record> {
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
            Ok(Some(Ok(record))) => out.push(record),
            other => panic!(
                "shard {shard}: expected record {} of {n}, got {other:?} (logs: {})",
                out.len() + 1,
                support::logs_dir().display()
            ),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_1200_records_goes_out_in_three_calls_and_reads_back_in_order_per_key() {
    support::init_tracing();
    let (recording, api) = local();
    let stream = support::unique_name("publish-batch");
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let keys: Vec<String> = (0..7).map(|k| format!("key-{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut batch = records(&keys, 172); // 1,204 records, 172 per key
    batch.truncate(1200);
    let sent: Vec<String> = batch
        .iter()
        .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
        .collect();

    let publisher = Publisher::new(api.clone(), stream.clone());
    let published = publisher.publish_batch(batch).await.expect("publish");

    assert_eq!(
        recording.layer().put_sizes(),
        [500, 500, 200],
        "three calls"
    );
    assert_eq!(
        recording.layer().puts().concat(),
        sent,
        "sent in input order"
    );
    assert_eq!(published.len(), 1200);

    // Read each shard from TRIM_HORIZON and match every record with its place.
    let place_of: HashMap<&str, &Published> = sent
        .iter()
        .map(String::as_str)
        .zip(published.iter())
        .collect();
    let mut all = Vec::new();
    for shard in [SHARD0, SHARD1] {
        let count = published.iter().filter(|p| p.shard_id == shard).count();
        let read = read_shard(&api, &stream, shard, count).await;
        for record in &read {
            let place = place_of[text(record).as_str()];
            assert_eq!(place.shard_id, record.shard_id());
            assert_eq!(place.sequence_number, record.sequence_number());
        }
        let texts: Vec<String> = read.iter().map(text).collect();
        assert_in_order_per_key(&texts);
        all.extend(texts);
    }
    assert_eq!(all.len(), 1200, "every record read back once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_service_would_refuse_are_refused_before_any_call() {
    support::init_tracing();
    let (recording, api) = local();
    let stream = support::unique_name("publish-invalid");
    support::create_stream(&support::kinesis_client(), &stream, 1).await;
    let publisher = Publisher::new(api, stream.clone());

    // data (1 MiB) + key (3 bytes): 3 bytes over the limit.
    let oversized = publisher.publish("big", vec![7u8; 1024 * 1024]).await;
    let Err(
        e @ KinesisError::InvalidRecord {
            size: 1_048_579, ..
        },
    ) = oversized
    else {
        panic!("expected InvalidRecord of 1,048,579 bytes, got {oversized:?}");
    };
    let message = e.to_string();
    for part in [stream.as_str(), "`big`", "1048579 bytes", "1048576 (1 MiB)"] {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }

    let empty = publisher.publish("", "x").await;
    let Err(e @ KinesisError::InvalidRecord { .. }) = empty else {
        panic!("expected InvalidRecord, got {empty:?}");
    };
    let message = e.to_string();
    assert!(message.contains("partition key is empty"), "{message}");
    assert!(message.contains(&stream), "{message}");

    let long_key = "k".repeat(257);
    let long = publisher.publish(long_key.clone(), "x").await;
    let Err(e @ KinesisError::InvalidRecord { .. }) = long else {
        panic!("expected InvalidRecord, got {long:?}");
    };
    let message = e.to_string();
    assert!(message.contains("257 characters"), "{message}");
    assert!(message.contains("at most 256"), "{message}");
    assert!(message.contains(&stream), "{message}");
    assert!(message.contains("258 bytes"), "size named: {message}");

    // One bad record refuses the whole batch, naming its position; nothing is sent.
    let mut batch = records(&["a", "b"], 3);
    batch.insert(4, OutgoingRecord::new("", "x"));
    let refused = publisher.publish_batch(batch).await;
    assert!(
        matches!(refused, Err(KinesisError::InvalidRecord { index: 4, .. })),
        "{refused:?}"
    );
    assert!(
        recording.layer().puts().is_empty(),
        "no call for refused records"
    );

    // At the limits exactly, the service takes them.
    let key = "k".repeat(256);
    let exact = publisher
        .publish(key.clone(), vec![1u8; 1024 * 1024 - 256])
        .await
        .expect("a record of exactly 1 MiB with a 256-character key");
    assert_eq!(exact.shard_id, SHARD0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stream_is_stream_not_found_without_retries() {
    support::init_tracing();
    let (recording, api) = local();
    let stream = support::unique_name("publish-missing");
    let result = Publisher::new(api, stream.clone())
        .publish_batch(records(&["a"], 3))
        .await;
    let Err(e @ KinesisError::StreamNotFound { .. }) = result else {
        panic!("expected StreamNotFound, got {result:?}");
    };
    assert!(e.to_string().contains(&stream), "{e}");
    assert_eq!(recording.layer().put_sizes(), [3], "one call, not retried");
}

// ---------------------------------------------------------------------------------------------
// On the in-memory transport, paused time

/// A round that stored some records resets the backoff to its first wait; only rounds in a
/// row that stored nothing double it.
#[tokio::test(start_paused = true)]
async fn the_backoff_doubles_only_over_rounds_that_stored_nothing() {
    let (memory, recording) = memory_stream("orders");
    let low = keys_on(SHARD0, "low", 1);
    let high = keys_on(SHARD1, "high", 1);
    memory.inject(
        Fault::fail(Operation::PutRecords, "internal failure")
            .on_shard(SHARD0)
            .times(4),
    );
    let publisher = Publisher::new(recording.clone(), "orders");
    publisher
        .publish_batch(records(&[&*low[0], &*high[0]], 1))
        .await
        .expect("publish");
    // Round 1 stores the high key's record; rounds 2 to 4 store nothing; round 5 the rest.
    let gaps = gaps(&put_calls(&memory));
    assert_eq!(gaps.len(), 4, "{gaps:?}");
    let ms = |n| Duration::from_millis(n);
    let within = |gap: Duration, from: u64, to: u64| gap >= ms(from) && gap <= ms(to);
    assert!(
        within(gaps[0], 50, 100),
        "after progress: the first wait {gaps:?}"
    );
    assert!(
        within(gaps[1], 50, 100),
        "one round without progress {gaps:?}"
    );
    assert!(within(gaps[2], 100, 200), "two in a row {gaps:?}");
    assert!(within(gaps[3], 200, 400), "three in a row {gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn failed_entries_are_retried_and_stored_ones_are_not_resent() {
    let (memory, recording) = memory_stream("orders");
    let low = keys_on(SHARD0, "low", 2);
    let high = keys_on(SHARD1, "high", 2);
    let keys = [&*low[0], &*high[0], &*low[1], &*high[1]];
    let batch = records(&keys, 3); // 12 records, 6 per shard
    let sent: Vec<String> = batch
        .iter()
        .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
        .collect();
    memory.inject(Fault::throttle(Operation::PutRecords).on_shard(SHARD0));

    let (events, _guard) = capture(tracing::Level::WARN);
    let publisher = Publisher::new(recording.clone(), "orders");
    let published = publisher.publish_batch(batch).await.expect("publish");

    let low_sent: Vec<String> = sent
        .iter()
        .filter(|t| t.starts_with("low"))
        .cloned()
        .collect();
    let high_sent: Vec<String> = sent
        .iter()
        .filter(|t| t.starts_with("high"))
        .cloned()
        .collect();
    assert_eq!(
        recording.layer().puts(),
        [sent.clone(), low_sent.clone()],
        "the retry carries exactly the failed entries, in their order"
    );
    assert_eq!(stored(&memory, "orders", SHARD0), low_sent);
    assert_eq!(
        stored(&memory, "orders", SHARD1),
        high_sent,
        "stored entries are not sent again"
    );

    // Results in input order, each naming where its record is.
    let mut by_shard: HashMap<String, Vec<Record>> = HashMap::new();
    for shard in [SHARD0, SHARD1] {
        by_shard.insert(shard.into(), memory.records("orders", shard).unwrap());
    }
    for (text_sent, place) in sent.iter().zip(&published) {
        let record = by_shard[&place.shard_id]
            .iter()
            .find(|r| r.sequence_number() == place.sequence_number)
            .unwrap();
        assert_eq!(&text(record), text_sent);
    }

    // One backoff between the calls: within [50 ms, 100 ms] for the first retry.
    let gaps = gaps(&put_calls(&memory));
    assert_eq!(gaps.len(), 1);
    assert!(
        gaps[0] >= Duration::from_millis(50) && gaps[0] <= Duration::from_millis(100),
        "{gaps:?}"
    );
    let events = events.text();
    assert!(events.contains("WARN"), "{events}");
    assert!(events.contains("failed=6"), "{events}");
    assert!(events.contains("left=6"), "{events}");
    assert!(events.contains(THROTTLED), "{events}");
}

#[tokio::test(start_paused = true)]
async fn a_keys_records_are_stored_in_publish_order_despite_failures() {
    let (memory, recording) = memory_stream("orders");
    let a = keys_on(SHARD0, "a", 1).remove(0);
    let b = keys_on(SHARD1, "b", 1).remove(0);
    let batch = records(&[&a, &b], 8); // a#0 b#0 a#1 b#1 ...
    // Every call touching shard 0 fails its entries there, twice.
    memory.inject(
        Fault::fail(Operation::PutRecords, "internal failure")
            .on_shard(SHARD0)
            .times(2),
    );
    let publisher = Publisher::new(recording.clone(), "orders").max_records_per_call(4);
    publisher.publish_batch(batch).await.expect("publish");

    let name = |key: &str, ns: &[usize]| -> Vec<String> {
        ns.iter().map(|n| format!("{key}#{n}")).collect()
    };
    let interleaved = vec![
        format!("{a}#0"),
        format!("{b}#0"),
        format!("{a}#1"),
        format!("{b}#1"),
    ];
    assert_eq!(
        recording.layer().puts(),
        [
            // Round 1: a#0 and a#1 fail, so a's later records are held back; b goes on.
            interleaved,
            name(&b, &[2, 3, 4, 5]),
            name(&b, &[6, 7]),
            // Round 2: a's records from the failed one on, in order; they fail again.
            name(&a, &[0, 1, 2, 3]),
            // Round 3: stored.
            name(&a, &[0, 1, 2, 3]),
            name(&a, &[4, 5, 6, 7]),
        ]
    );
    assert_eq!(
        stored(&memory, "orders", SHARD0),
        name(&a, &[0, 1, 2, 3, 4, 5, 6, 7])
    );
    assert_eq!(
        stored(&memory, "orders", SHARD1),
        name(&b, &[0, 1, 2, 3, 4, 5, 6, 7])
    );
}

#[tokio::test(start_paused = true)]
async fn strict_order_keeps_a_key_in_order_even_across_shards() {
    // One partition key, spread over both shards by explicit hash keys: the only way the
    // in-memory service can fail one entry of a key and store a later one in the same call.
    let upper = (1u128 << 127).to_string();
    let batch = || {
        vec![
            OutgoingRecord::new("k", "k#0").with_explicit_hash_key("0"),
            OutgoingRecord::new("k", "k#1").with_explicit_hash_key(upper.clone()),
            OutgoingRecord::new("k", "k#2").with_explicit_hash_key("0"),
        ]
    };

    // Batched: the service stores k#1 while k#0 fails in the same call, and the publisher
    // says so.
    let (memory, recording) = memory_stream("orders");
    memory.inject(Fault::throttle(Operation::PutRecords).on_shard(SHARD0));
    let (events, guard) = capture(tracing::Level::WARN);
    Publisher::new(recording.clone(), "orders")
        .publish_batch(batch())
        .await
        .expect("publish");
    drop(guard);
    assert_eq!(
        recording.layer().puts(),
        [vec!["k#0", "k#1", "k#2"], vec!["k#0", "k#2"]]
    );
    let events = events.text();
    assert!(
        events.contains("ahead of an earlier record of the same partition key"),
        "{events}"
    );
    assert!(events.contains("partition_key=k"), "{events}");

    // Strict: k#1 is sent only once k#0 is stored.
    let (memory, recording) = memory_stream("orders");
    memory.inject(Fault::throttle(Operation::PutRecords).on_shard(SHARD0));
    Publisher::new(recording.clone(), "orders")
        .key_order(KeyOrder::Strict)
        .publish_batch(batch())
        .await
        .expect("publish");
    assert_eq!(
        recording.layer().puts(),
        [vec!["k#0"], vec!["k#0"], vec!["k#1"], vec!["k#2"]]
    );
    assert_eq!(stored(&memory, "orders", SHARD0), ["k#0", "k#2"]);
    assert_eq!(stored(&memory, "orders", SHARD1), ["k#1"]);
}

#[tokio::test(start_paused = true)]
async fn strict_order_still_batches_many_keys() {
    let (_memory, recording) = memory_stream("orders");
    let keys: Vec<String> = (0..50).map(|k| format!("key-{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    Publisher::new(recording.clone(), "orders")
        .key_order(KeyOrder::Strict)
        .publish_batch(records(&keys, 4))
        .await
        .expect("publish");
    assert_eq!(recording.layer().put_sizes(), [50, 50, 50, 50]);
}

/// Records turned away only by a shard's write limit are retried after the first backoff,
/// without doubling and without counting against `max_attempts`, for as long as the counted
/// rounds would have waited in all (`RetryPolicy::patience`).
#[tokio::test(start_paused = true)]
async fn records_over_the_write_limit_are_retried_at_the_first_backoff_for_the_patience() {
    let (memory, recording) = memory_stream("orders");
    let a = keys_on(SHARD0, "a", 1).remove(0);
    let b = keys_on(SHARD1, "b", 1).remove(0);
    memory.inject(
        Fault::throttle(Operation::PutRecords)
            .on_shard(SHARD0)
            .times(u32::MAX),
    );
    let policy = RetryPolicy::default().max_attempts(3);
    assert_eq!(policy.patience(), Duration::from_millis(300));
    let publisher = Publisher::new(recording.clone(), "orders").retry(policy);
    let started = tokio::time::Instant::now();
    let failure = failure(publisher.publish_batch(records(&[&a, &b], 5)).await);
    let waited = started.elapsed();
    let gaps = gaps(&put_calls(&memory));
    assert!(
        gaps.iter()
            .all(|g| *g >= Duration::from_millis(50) && *g <= Duration::from_millis(100)),
        "every wait the first backoff: {gaps:?}"
    );
    assert!(
        waited >= Duration::from_millis(300) && waited <= Duration::from_millis(400),
        "gave up once the patience ran out: {waited:?}"
    );
    assert!(failure.attempts > 3, "rounds sent: {}", failure.attempts);
    assert_eq!(failure.attempts as usize, gaps.len() + 1);
    assert_eq!((failure.written(), failure.failed.len()), (5, 5));
    assert_eq!(failure.last_code, THROTTLED);
    let message = KinesisError::PublishFailed(Box::new(failure)).to_string();
    assert!(message.contains(THROTTLED), "{message}");
}

#[tokio::test(start_paused = true)]
async fn used_up_retries_return_the_error_naming_counts_and_the_records() {
    let (memory, recording) = memory_stream("orders");
    let a = keys_on(SHARD0, "a", 1).remove(0);
    let b = keys_on(SHARD1, "b", 1).remove(0);
    memory.inject(
        Fault::fail(Operation::PutRecords, "internal failure")
            .on_shard(SHARD0)
            .times(u32::MAX),
    );
    let publisher =
        Publisher::new(recording.clone(), "orders").retry(RetryPolicy::default().max_attempts(3));

    let failure = failure(publisher.publish_batch(records(&[&a, &b], 5)).await);
    assert_eq!(failure.stream, "orders");
    assert_eq!(failure.attempts, 3);
    assert_eq!(failure.total(), 10);
    assert_eq!(failure.written(), 5);
    assert_eq!(failure.failed.len(), 5);
    assert_eq!(failure.last_code, INTERNAL);
    assert!(!failure.stopped_early);
    assert_eq!(memory.call_count(Operation::PutRecords), 3);
    assert_eq!(recording.layer().put_sizes(), [10, 5, 5]);
    // The failed records are a's, in order: the first failed on its own, the rest were
    // sent too (one call) and failed; all are handed back.
    let indices: Vec<usize> = failure.failed.iter().map(|f| f.index).collect();
    assert_eq!(indices, [0, 2, 4, 6, 8]);
    assert_eq!(failure.failed[0].behind, None);
    assert!(failure.failed[1..].iter().all(|f| f.behind == Some(0)));
    assert!(
        failure
            .failed
            .iter()
            .all(|f| f.last_error.as_ref().is_some_and(|e| e.code == INTERNAL))
    );
    for (i, place) in failure.published.iter().enumerate() {
        assert_eq!(place.is_some(), i % 2 == 1, "b's records are written");
    }

    let message = KinesisError::PublishFailed(Box::new(failure.clone())).to_string();
    for part in [
        "`orders`",
        "gave up after 3 attempts",
        "5 of 10 records were not written and 5 were",
        INTERNAL,
        "records 0, 2, 4, 6, 8",
        "publish them again in this order",
    ] {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }

    // Publishing the handed-back records again finishes the batch in order.
    memory.clear_faults();
    publisher
        .publish_batch(failure.into_failed_records())
        .await
        .expect("republish");
    assert_eq!(
        stored(&memory, "orders", SHARD0),
        (0..5).map(|n| format!("{a}#{n}")).collect::<Vec<_>>()
    );
    assert_eq!(stored(&memory, "orders", SHARD1).len(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_whole_failed_call_is_retried_with_growing_backoff() {
    let (memory, recording) = memory_stream("orders");
    memory.inject(Fault::fail(Operation::PutRecords, "service unavailable").times(2));
    let publisher = Publisher::new(recording.clone(), "orders");
    let published = publisher
        .publish_batch(records(&["a", "b", "c"], 2))
        .await
        .expect("publish");
    assert_eq!(published.len(), 6);
    assert_eq!(recording.layer().put_sizes(), [6, 6, 6]);
    let gaps = gaps(&put_calls(&memory));
    assert!(
        gaps[0] >= Duration::from_millis(50) && gaps[0] <= Duration::from_millis(100),
        "{gaps:?}"
    );
    assert!(
        gaps[1] >= Duration::from_millis(100) && gaps[1] <= Duration::from_millis(200),
        "{gaps:?}"
    );
    let total = stored(&memory, "orders", SHARD0).len() + stored(&memory, "orders", SHARD1).len();
    assert_eq!(total, 6, "stored once each");
}

#[tokio::test(start_paused = true)]
async fn the_backoff_is_the_same_every_run_on_paused_time() {
    async fn waits() -> Vec<Duration> {
        let memory = MemoryKinesis::new();
        memory.add_stream("orders", 1).unwrap();
        memory.inject(Fault::throttle(Operation::PutRecords).times(5));
        Publisher::new(Arc::new(memory.clone()), "orders")
            .publish("a", "x")
            .await
            .expect("publish");
        gaps(&put_calls(&memory))
    }
    let first = waits().await;
    assert_eq!(first.len(), 5);
    assert_eq!(first, waits().await);
    let steps = [100, 200, 400, 800, 1600].map(Duration::from_millis);
    for (wait, step) in first.iter().zip(steps) {
        assert!(*wait >= step / 2 && *wait <= step, "{first:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_retrying_cannot_fix_stops_at_once() {
    // Nothing written yet: the service's own error.
    let memory = MemoryKinesis::new();
    let recording = Recorder::over(Arc::new(memory.clone()));
    let missing = Publisher::new(recording.clone(), "missing")
        .publish_batch(records(&["a"], 2))
        .await;
    assert!(
        matches!(missing, Err(KinesisError::StreamNotFound { .. })),
        "{missing:?}"
    );
    assert_eq!(recording.layer().put_sizes(), [2], "not retried");

    // Some written: a failure naming the counts, the rest handed back unsent.
    memory.add_stream("orders", 1).unwrap();
    let recording = Recorder::denying_from_call(Arc::new(memory.clone()), 2);
    let result = Publisher::new(recording.clone(), "orders")
        .max_records_per_call(2)
        .publish_batch(records(&["a", "b"], 3))
        .await;
    let failure = failure(result);
    assert!(failure.stopped_early);
    assert_eq!(failure.attempts, 1);
    assert_eq!((failure.written(), failure.failed.len()), (2, 4));
    assert_eq!(failure.last_code, "AccessDenied");
    assert!(failure.last_message.contains("kinesis:PutRecords"));
    assert_eq!(
        recording.layer().put_sizes(),
        [2, 2],
        "no call after the denial"
    );
    let sent_or_not: Vec<bool> = failure
        .failed
        .iter()
        .map(|f| f.last_error.is_some())
        .collect();
    assert_eq!(sent_or_not, [true, true, false, false]);
    let message = KinesisError::PublishFailed(Box::new(failure)).to_string();
    assert!(message.contains("retrying cannot fix"), "{message}");
    assert!(message.contains("4 of 6 records"), "{message}");
}

/// A call that went unanswered may have stored its records: a failure retrying cannot fix
/// after it must not read as "nothing written" (the service's bare error), but hand the
/// records back marked as possibly stored.
#[tokio::test(start_paused = true)]
async fn a_failure_after_an_unanswered_call_says_the_records_may_be_stored() {
    let memory = MemoryKinesis::new();
    memory.add_stream("orders", 1).unwrap();
    for aggregated in [false, true] {
        // The first call takes a day (given up after PUT_CALL_TIMEOUT); the second is denied.
        memory.inject(Fault::latency(Operation::PutRecords, Duration::from_secs(86_400)).times(1));
        let recording = Recorder::denying_from_call(Arc::new(memory.clone()), 2);
        let publisher = Publisher::new(recording.clone(), "orders").without_collect();
        let publisher = if aggregated {
            publisher.aggregate(kinesis_dataflow::publish::Aggregate::default())
        } else {
            publisher
        };
        let result = publisher.publish_batch(records(&["a", "b"], 2)).await;
        let calls = if aggregated { [1, 1] } else { [4, 4] };
        assert_eq!(
            recording.layer().put_sizes(),
            calls,
            "aggregated {aggregated}"
        );
        let failure = failure(result);
        assert!(failure.stopped_early);
        assert_eq!(failure.last_code, "AccessDenied");
        assert_eq!((failure.written(), failure.failed.len()), (0, 4));
        assert!(
            failure.failed.iter().all(|f| f.maybe_stored),
            "aggregated {aggregated}: {:?}",
            failure.failed
        );
        let message = KinesisError::PublishFailed(Box::new(failure)).to_string();
        assert!(message.contains("may have been stored"), "{message}");
    }

    // Denied at once, every call answered: the service's own error, nothing stored.
    let recording = Recorder::denying_from_call(Arc::new(memory.clone()), 1);
    let denied = Publisher::new(recording, "orders")
        .publish_batch(records(&["a"], 1))
        .await;
    assert!(
        matches!(denied, Err(KinesisError::AccessDenied { .. })),
        "{denied:?}"
    );
}

/// An answer that leaves an entry without a result says nothing of what became of it: a
/// failure after it hands the record back marked as possibly stored, never as the bare error
/// of "nothing written".
#[tokio::test(start_paused = true)]
async fn an_entry_the_answer_says_nothing_of_may_be_stored() {
    let memory = MemoryKinesis::new();
    memory.add_stream("orders", 1).unwrap();
    for (keys, aggregated) in [(&["a"][..], false), (&["a", "b"], false), (&["a"], true)] {
        let recorder = Recorder {
            deny_from_call: Some(2),
            short_answer_on_call: Some(1),
            ..Recorder::default()
        };
        let recording = Layered::new(Arc::new(memory.clone()), recorder).shared();
        let publisher = Publisher::new(recording.clone(), "orders").without_collect();
        let publisher = if aggregated {
            publisher.aggregate(kinesis_dataflow::publish::Aggregate::default())
        } else {
            publisher
        };
        let result = publisher.publish_batch(records(keys, 1)).await;
        assert_eq!(recording.layer().put_sizes().len(), 2, "{keys:?}");
        let failure = failure(result);
        assert_eq!(failure.last_code, "AccessDenied", "{keys:?}");
        assert_eq!(failure.failed.len(), 1, "{keys:?}: {:?}", failure.failed);
        assert!(
            failure.failed[0].maybe_stored,
            "{keys:?}: {:?}",
            failure.failed
        );
    }
}

#[tokio::test]
async fn bad_settings_are_refused_before_any_call() {
    let (_memory, recording) = memory_stream("orders");
    let publisher = Publisher::new(recording.clone(), "orders");
    for (bad, setting) in [
        (
            publisher.clone().max_records_per_call(501),
            "max_records_per_call",
        ),
        (
            publisher.clone().max_records_per_call(0),
            "max_records_per_call",
        ),
        (
            publisher.clone().max_bytes_per_call(1024),
            "max_bytes_per_call",
        ),
        (
            publisher.clone().max_bytes_per_call(5 * 1024 * 1024 + 1),
            "max_bytes_per_call",
        ),
        (
            publisher
                .clone()
                .retry(RetryPolicy::default().max_attempts(0)),
            "max_attempts",
        ),
    ] {
        match bad.publish("a", "x").await {
            Err(KinesisError::InvalidConfig { setting: s, .. }) => assert_eq!(s, setting),
            other => panic!("{setting}: expected InvalidConfig, got {other:?}"),
        }
    }
    assert!(recording.layer().puts().is_empty());
    assert!(
        publisher
            .publish_batch(Vec::new())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        recording.layer().puts().is_empty(),
        "an empty batch makes no call"
    );
}

/// `aggregate(..)` then `without_collect()`: aggregation needs collection, so the pair is
/// refused by name rather than aggregation silently turned off; `without_collect()` then
/// `aggregate(..)` aggregates (and collects again), as does `collect(..)` after the pair.
#[tokio::test]
async fn aggregation_then_without_collect_is_refused_naming_both() {
    use kinesis_dataflow::publish::{Aggregate, Collect};
    let (memory, recording) = memory_stream("orders");
    let publisher = Publisher::new(recording.clone(), "orders");
    let refused = publisher
        .clone()
        .aggregate(Aggregate::default())
        .without_collect();
    let error = refused.validate().unwrap_err();
    let KinesisError::InvalidConfig { setting, .. } = &error else {
        panic!("InvalidConfig, not {error:?}");
    };
    assert_eq!(*setting, "without_collect");
    let message = error.to_string();
    assert!(message.contains("aggregate"), "{message}");
    assert!(
        matches!(
            refused.publish("a", "x").await,
            Err(KinesisError::InvalidConfig { .. })
        ),
        "publishing refuses it too"
    );
    assert!(recording.layer().puts().is_empty(), "nothing sent");

    // The other way round, or with `collect(..)` after the pair, it aggregates: two records
    // of one key, one aggregate.
    for aggregating in [
        publisher
            .clone()
            .without_collect()
            .aggregate(Aggregate::default()),
        publisher
            .clone()
            .aggregate(Aggregate::default())
            .without_collect()
            .collect(Collect::default()),
    ] {
        aggregating.validate().unwrap();
        let records = vec![OutgoingRecord::new("a", "1"), OutgoingRecord::new("a", "2")];
        let places = aggregating.publish_batch(records).await.unwrap();
        assert_eq!(places[1].sub_sequence_number, Some(1), "aggregated");
    }
    drop(memory);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_publish_through_clones_at_once() {
    fn shareable<T: Clone + Send + Sync + 'static>(_: &T) {}
    // Collected by default: the tasks' publishes share calls. Without: one call each.
    for collect in [true, false] {
        let (memory, recording) = memory_stream("orders");
        // Each call takes a while, as over the network: publishes arrive meanwhile.
        memory.set_latency(Duration::from_millis(2));
        let mut publisher = Publisher::new(recording.clone(), "orders");
        if !collect {
            publisher = publisher.without_collect();
        }
        shareable(&publisher);

        let tasks: Vec<_> = (0..32)
            .map(|t| {
                let publisher = publisher.clone();
                tokio::spawn(async move {
                    let key = format!("task-{t}");
                    for n in 0..10 {
                        publisher
                            .publish(key.clone(), format!("{key}#{n}"))
                            .await
                            .expect("publish");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let calls = recording.layer().put_sizes().len();
        if collect {
            assert!(
                calls < 320,
                "publishes share calls by default: {calls} calls"
            );
        } else {
            assert_eq!(calls, 320, "one call per publish without collection");
        }
        let mut all = stored(&memory, "orders", SHARD0);
        all.extend(stored(&memory, "orders", SHARD1));
        assert_eq!(all.len(), 320);
        assert_in_order_per_key(&all);
    }
}

/// A PutRecords call that never answers (a connection gone half-open after the request was
/// sent) is given up after the publisher's call timeout and made again, with collection (its
/// call slots would otherwise be held for good, and every later publish wait for one) and
/// without.
#[tokio::test(start_paused = true)]
async fn a_put_records_call_that_never_answers_is_given_up_and_made_again() {
    let day = Duration::from_secs(24 * 3600);
    for collected in [true, false] {
        let memory = MemoryKinesis::new();
        memory.add_stream("orders", 1).unwrap();
        memory.inject(Fault::latency(Operation::PutRecords, day).times(4));
        let publisher = Publisher::new(Arc::new(memory.clone()), "orders");
        let publisher = if collected {
            publisher
        } else {
            publisher.without_collect()
        };
        let publishes = (0..5).map(|i| {
            let publisher = publisher.clone();
            async move { publisher.publish(format!("k{i}"), format!("r{i}")).await }
        });
        let stored = tokio::time::timeout(
            Duration::from_secs(600),
            futures::future::join_all(publishes),
        )
        .await
        .unwrap_or_else(|_| panic!("collected {collected}: a publish hung on a stalled call"));
        for (i, result) in stored.iter().enumerate() {
            assert!(result.is_ok(), "collected {collected}, r{i}: {result:?}");
        }
        assert_eq!(
            memory.records("orders", SHARD0).unwrap().len(),
            5,
            "collected {collected}: the stalled calls wrote nothing; each record once"
        );
    }
}

/// Panics in the first PutRecords call it sees (a bug in a transport layer), while the
/// collecting task carries it.
#[derive(Default)]
struct PanicsOnce(std::sync::atomic::AtomicBool);

impl KinesisLayer for PanicsOnce {
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        if self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return inner.put_records(stream, entries);
        }
        Box::pin(async move { panic!("a transport layer's bug (the test's)") })
    }
}

/// The task carrying a collected call dies (the transport panics in it): the publish hands
/// every record back as possibly stored (the call may have been made), not an error without
/// them; publishing them again works.
#[tokio::test(start_paused = true)]
async fn a_call_lost_with_its_task_hands_the_records_back() {
    let memory = MemoryKinesis::new();
    memory.add_stream("orders", 1).unwrap();
    let api = Layered::new(Arc::new(memory.clone()), PanicsOnce::default()).shared();
    let publisher = Publisher::new(api, "orders");
    let sent = records(&["a", "b"], 2);
    let failure = failure(publisher.publish_batch(sent.clone()).await);
    assert_eq!(failure.written(), 0);
    assert_eq!(failure.last_code, "PublisherStopped", "{failure:?}");
    let back: Vec<OutgoingRecord> = failure.failed.iter().map(|f| f.record.clone()).collect();
    assert_eq!(back, sent);
    assert!(failure.failed.iter().all(|f| f.maybe_stored), "{failure:?}");

    publisher.publish_batch(back).await.unwrap();
    assert_eq!(stored(&memory, "orders", SHARD0).len(), 4);
}
