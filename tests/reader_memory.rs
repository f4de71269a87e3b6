//! The shard reader's timing and recovery rules, on the in-memory transport with paused tokio
//! time: every wait below is virtual, so the assertions are exact and never depend on the
//! machine's speed.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::api::memory::{Call, Fault};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::kpl::aggregate;
use kinesis_dataflow::shard::SettledPosition;
use kinesis_dataflow::{
    KinesisError, MemoryKinesis, ReadSettings, Record, ShardStream, StartingPoint,
};
use tokio::time::{Instant, timeout};

const STREAM: &str = "events";
const SHARD0: &str = "shardId-000000000000";
const KPL_MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

fn kinesis_with(records: usize) -> (MemoryKinesis, SharedKinesis) {
    let (memory, shared) = kinesis_with_shards(1);
    for i in 0..records {
        memory.put(STREAM, "key", format!("r{i}")).unwrap();
    }
    (memory, shared)
}

/// A transport whose stream has `shards` shards, all empty.
fn kinesis_with_shards(shards: usize) -> (MemoryKinesis, SharedKinesis) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, shards as u32).unwrap();
    let shared: SharedKinesis = Arc::new(memory.clone());
    (memory, shared)
}

fn open(api: &SharedKinesis, settings: ReadSettings, at: StartingPoint) -> ShardStream {
    ShardStream::builder(api.clone(), STREAM, SHARD0)
        .settings(settings)
        .open(at)
        .unwrap()
}

async fn take(stream: &mut ShardStream, n: usize) -> Vec<Record> {
    let mut out = Vec::new();
    for _ in 0..n {
        match timeout(Duration::from_secs(3600), stream.next()).await {
            Ok(Some(Ok(r))) => out.push(r),
            other => panic!("expected a record, got {other:?}"),
        }
    }
    out
}

fn text(r: &Record) -> String {
    String::from_utf8(r.data().to_vec()).unwrap()
}

/// The data of each of `records`, as text, in order.
fn texts(records: &[Record]) -> Vec<String> {
    records.iter().map(text).collect()
}

fn calls_of(memory: &MemoryKinesis, op: Operation) -> Vec<Call> {
    memory
        .calls()
        .into_iter()
        .filter(|c| c.operation == op)
        .collect()
}

fn gaps(calls: &[Call]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1].at - w[0].at).collect()
}

#[tokio::test(start_paused = true)]
async fn an_empty_read_waits_the_poll_interval() {
    let (memory, api) = kinesis_with(0);
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::Latest);
    assert!(
        timeout(Duration::from_millis(3500), shard.next())
            .await
            .is_err()
    );
    let reads = calls_of(&memory, Operation::GetRecords);
    let between = gaps(&reads);
    // Entering the idle rhythm, the first wait is shortened by the shard's phase; then one
    // interval between reads.
    assert!(reads.len() >= 4, "{between:?}");
    assert!(between[0] <= Duration::from_secs(1), "{between:?}");
    assert!(
        between[1..].iter().all(|g| *g == Duration::from_secs(1)),
        "{between:?}"
    );

    let (memory, api) = kinesis_with(0);
    let settings = ReadSettings::default().poll_interval(Duration::from_millis(250));
    let mut shard = open(&api, settings, StartingPoint::Latest);
    assert!(
        timeout(Duration::from_millis(1100), shard.next())
            .await
            .is_err()
    );
    let reads = calls_of(&memory, Operation::GetRecords);
    let between = gaps(&reads);
    assert!(reads.len() >= 5, "{between:?}");
    assert!(
        between[1..]
            .iter()
            .all(|g| *g == Duration::from_millis(250)),
        "{between:?}"
    );
}

/// Idle readers opened together (or drained together) poll at different moments of the
/// interval, not all at once: over HTTP/1.1 each call in flight at once holds a connection of
/// its own, so readers in step keep one pooled connection per shard.
#[tokio::test(start_paused = true)]
async fn idle_readers_opened_together_poll_at_different_moments() {
    const SHARDS: usize = 40;
    let (memory, api) = kinesis_with_shards(SHARDS);
    let mut readers: Vec<ShardStream> = (0..SHARDS)
        .map(|i| {
            ShardStream::builder(api.clone(), STREAM, format!("shardId-{i:012}"))
                .open(StartingPoint::Latest)
                .unwrap()
        })
        .collect();
    let all = futures::future::join_all(readers.iter_mut().map(|r| r.next()));
    assert!(timeout(Duration::from_millis(4500), all).await.is_err());
    let reads = calls_of(&memory, Operation::GetRecords);
    let start = reads[0].at;
    // After the first reads (all at the start), the most reads at any one instant.
    let mut at_once: std::collections::BTreeMap<Duration, usize> = Default::default();
    for call in reads.iter().filter(|c| c.at > start) {
        *at_once.entry(call.at - start).or_default() += 1;
    }
    let most = at_once.values().copied().max().unwrap_or(0);
    assert!(
        most <= 3,
        "{most} of {SHARDS} idle readers read at the same instant: {at_once:?}"
    );
    assert!(at_once.len() >= SHARDS * 3 / 4, "{at_once:?}");
}

#[tokio::test(start_paused = true)]
async fn reads_stay_under_the_rate_cap() {
    for (settings, gap) in [
        (ReadSettings::default(), Duration::from_millis(200)),
        (
            ReadSettings::default().max_reads_per_second(2),
            Duration::from_millis(500),
        ),
        (ReadSettings::default().unlimited_reads(), Duration::ZERO),
    ] {
        let (memory, api) = kinesis_with(20);
        let mut shard = open(&api, settings.batch_size(1), StartingPoint::TrimHorizon);
        let read = take(&mut shard, 20).await;
        assert_eq!(text(&read[19]), "r19");
        let reads = calls_of(&memory, Operation::GetRecords);
        assert_eq!(reads.len(), 20);
        assert!(reads.iter().all(|c| c.limit == Some(1)));
        for g in gaps(&reads) {
            assert_eq!(g, gap);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn asks_for_a_thousand_records_or_the_batch_size() {
    let (memory, api) = kinesis_with(3);
    take(
        &mut open(&api, ReadSettings::default(), StartingPoint::TrimHorizon),
        3,
    )
    .await;
    assert_eq!(
        calls_of(&memory, Operation::GetRecords)[0].limit,
        Some(1000)
    );
    let (memory, api) = kinesis_with(3);
    take(
        &mut open(
            &api,
            ReadSettings::default().batch_size(250),
            StartingPoint::TrimHorizon,
        ),
        3,
    )
    .await;
    assert_eq!(calls_of(&memory, Operation::GetRecords)[0].limit, Some(250));
}

#[tokio::test(start_paused = true)]
async fn a_throttled_read_waits_one_interval_and_keeps_its_iterator() {
    let (memory, api) = kinesis_with(3);
    memory.inject(Fault::throttle(Operation::GetRecords).times(2));
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
    let read = take(&mut shard, 3).await;
    assert_eq!(texts(&read), ["r0", "r1", "r2"]);
    let reads = calls_of(&memory, Operation::GetRecords);
    assert_eq!(reads.len(), 3, "two throttled reads, then the good one");
    assert_eq!(
        gaps(&reads),
        [Duration::from_secs(1), Duration::from_secs(1)]
    );
    assert_eq!(
        reads[0].iterator, reads[2].iterator,
        "the same iterator is retried"
    );
    assert_eq!(calls_of(&memory, Operation::GetShardIterator).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_is_reported_then_retried() {
    let (memory, api) = kinesis_with(2);
    memory.inject(Fault::fail(Operation::GetRecords, "injected 500").times(1));
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
    match shard.next().await {
        Some(Err(KinesisError::Service { message, .. })) => {
            assert!(message.contains("injected 500"))
        }
        other => panic!("expected the failure on the stream, got {other:?}"),
    }
    let read = take(&mut shard, 2).await;
    assert_eq!(text(&read[0]), "r0", "nothing lost after the failure");
    let reads = calls_of(&memory, Operation::GetRecords);
    assert_eq!(gaps(&reads), [Duration::from_secs(1)]);
    assert_eq!(reads[0].iterator, reads[1].iterator);
}

#[tokio::test(start_paused = true)]
async fn eleven_failures_in_a_row_stop_the_reader() {
    // Ten failures: reported, and the reader goes on.
    let (memory, api) = kinesis_with(1);
    memory.inject(Fault::fail(Operation::GetRecords, "boom").times(10));
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
    for _ in 0..10 {
        assert!(matches!(
            shard.next().await,
            Some(Err(KinesisError::Service { .. }))
        ));
    }
    assert_eq!(text(&take(&mut shard, 1).await[0]), "r0");

    // Eleven: the eleventh ends the stream with a terminal error.
    let (memory, api) = kinesis_with(1);
    memory.inject(Fault::fail(Operation::GetRecords, "boom").times(11));
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
    let started = Instant::now();
    for _ in 0..10 {
        assert!(matches!(
            shard.next().await,
            Some(Err(KinesisError::Service { .. }))
        ));
    }
    match shard.next().await {
        Some(Err(KinesisError::ReaderStopped {
            failures,
            shard: id,
            last,
            ..
        })) => {
            assert_eq!(failures, 11);
            assert_eq!(id, SHARD0);
            assert!(last.to_string().contains("boom"));
        }
        other => panic!("expected ReaderStopped, got {other:?}"),
    }
    assert!(
        shard.next().await.is_none(),
        "the stream ends after stopping"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "one second between tries"
    );
    assert!(shard.shard_end().is_none(), "a stop is not a shard end");
}

fn reopened_at(memory: &MemoryKinesis) -> Vec<StartingPoint> {
    calls_of(memory, Operation::GetShardIterator)
        .into_iter()
        .map(|c| c.starting_point.unwrap())
        .collect()
}

/// The consumer stalls past an iterator's life (five minutes, and a second more): the
/// reader's next GetRecords finds its iterator expired.
async fn outlive_the_iterator() {
    tokio::time::sleep(Duration::from_secs(301)).await;
}

/// What `reopened_at` says of a reader opened at TRIM_HORIZON whose iterator, once expired,
/// was renewed right after the record numbered `sequence_number`.
fn renewed_after(sequence_number: &str) -> [StartingPoint; 2] {
    [
        StartingPoint::TrimHorizon,
        StartingPoint::AfterSequence(sequence_number.to_owned()),
    ]
}

/// A reader of batches of two from TRIM_HORIZON that shares the settled position `settled`.
fn open_settled(api: &SharedKinesis, settled: &SettledPosition) -> ShardStream {
    ShardStream::builder(api.clone(), STREAM, SHARD0)
        .settings(ReadSettings::default().batch_size(2))
        .settled(settled.clone())
        .open(StartingPoint::TrimHorizon)
        .unwrap()
}

/// A reader from TRIM_HORIZON whose consumer stalls past an iterator's life after reading a
/// long way goes on after the last record it read: the next `count` records run from `first`
/// to `last` (no gap, no repeat), GetRecords is called `reads` times in all (`why` says
/// which), and the iterator is renewed once, right after that last record.
struct GoesOnAfterTheStall {
    count: usize,
    first: &'static str,
    last: &'static str,
    reads: usize,
    why: &'static str,
}

impl GoesOnAfterTheStall {
    /// Stalls past the iterator's life, reads on from `shard`, whose last record read before
    /// was `last_read`, and asserts all the above.
    async fn check(self, memory: &MemoryKinesis, shard: &mut ShardStream, last_read: &Record) {
        outlive_the_iterator().await;
        let rest = take(shard, self.count).await;
        assert_eq!(text(&rest[0]), self.first, "no gap, no repeat");
        assert_eq!(text(&rest[self.count - 1]), self.last);
        assert_eq!(
            memory.call_count(Operation::GetRecords),
            self.reads,
            "{}",
            self.why
        );
        assert_eq!(
            reopened_at(memory),
            renewed_after(last_read.sequence_number())
        );
    }
}

/// A reader sharing a settled position that lags behind what it handed on (records in
/// flight, not settled yet) renews an expired iterator after the last record it read: the
/// records between are handed on already, and their redelivery, if they fail, is the
/// settling side's business, so reading them again would only discard them.
#[tokio::test(start_paused = true)]
async fn an_expired_iterator_is_renewed_after_the_last_record_read_when_the_settled_one_lags() {
    let (memory, api) = kinesis_with(6);
    let settled = SettledPosition::new();
    let mut shard = open_settled(&api, &settled);
    let first = take(&mut shard, 2).await;
    settled.advance(first[0].sequence_number());
    outlive_the_iterator().await;
    let rest = take(&mut shard, 4).await;
    assert_eq!(texts(&rest), ["r2", "r3", "r4", "r5"]);
    assert_eq!(
        reopened_at(&memory),
        renewed_after(first[1].sequence_number())
    );
}

/// A settled position ahead of what the reader read (shared by a user who settled further)
/// is where an expired iterator is renewed: the records up to it need no reading.
#[tokio::test(start_paused = true)]
async fn an_expired_iterator_is_renewed_after_a_settled_record_ahead_of_the_last_read() {
    let (memory, api) = kinesis_with(6);
    let third = memory_seq(&api, 3).await;
    memory.clear_calls();
    let settled = SettledPosition::new();
    let mut shard = open_settled(&api, &settled);
    take(&mut shard, 2).await;
    settled.advance(&third);
    outlive_the_iterator().await;
    let rest = take(&mut shard, 2).await;
    assert_eq!(texts(&rest), ["r4", "r5"]);
    assert_eq!(reopened_at(&memory)[1], StartingPoint::AfterSequence(third));
}

#[tokio::test(start_paused = true)]
async fn an_expired_iterator_with_nothing_settled_reopens_after_the_last_record_read() {
    let (memory, api) = kinesis_with(6);
    let start = StartingPoint::AfterSequence(memory_seq(&api, 0).await);
    memory.clear_calls();
    let mut shard = open(&api, ReadSettings::default().batch_size(2), start);
    let first = take(&mut shard, 2).await;
    assert_eq!(text(&first[0]), "r1");
    outlive_the_iterator().await;
    let rest = take(&mut shard, 3).await;
    assert_eq!(texts(&rest), ["r3", "r4", "r5"], "no repeat, no gap");
    let opened = reopened_at(&memory);
    assert_eq!(
        opened[1],
        StartingPoint::AfterSequence(first[1].sequence_number().to_owned())
    );
}

/// After hours of reading, a consumer that stalls past an iterator's life must not make the
/// reader read the whole shard again from its first record (and discard it): the new
/// iterator goes on after the last record handed on, and the next answer is new records.
#[tokio::test(start_paused = true)]
async fn a_long_read_bare_stream_goes_on_after_an_expiry_without_reading_the_shard_again() {
    let (memory, api) = kinesis_with(2_500);
    let mut shard = open(
        &api,
        ReadSettings::default().batch_size(500),
        StartingPoint::TrimHorizon,
    );
    let read = take(&mut shard, 2_000).await;
    assert_eq!(memory.call_count(Operation::GetRecords), 4);
    // The consumer stalls for longer than an iterator lives.
    GoesOnAfterTheStall {
        count: 500,
        first: "r2000",
        last: "r2499",
        reads: 6,
        why: "the expired read and one read of the 500 new records, nothing read twice",
    }
    .check(&memory, &mut shard, &read[1_999])
    .await;
}

/// A de-aggregating reader whose consumer stalls in the middle of an aggregate's user
/// records: the rest of them come from the buffer, and the renewed iterator goes on after
/// the aggregate (read whole), with no user record repeated or skipped.
#[tokio::test(start_paused = true)]
async fn a_deaggregating_reader_stalled_inside_an_aggregate_goes_on_after_it() {
    let (memory, api) = kinesis_with(3);
    let users = [
        ("key", None, &b"u0"[..]),
        ("key", None, b"u1"),
        ("key", None, b"u2"),
        ("key", None, b"u3"),
    ];
    let (_, aggregate) = memory.put(STREAM, "key", aggregate(users)).unwrap();
    let mut shard = open(
        &api,
        ReadSettings::default().deaggregate(true),
        StartingPoint::TrimHorizon,
    );
    let before = take(&mut shard, 5).await;
    assert_eq!(texts(&before), ["r0", "r1", "r2", "u0", "u1"]);
    outlive_the_iterator().await;
    memory.put(STREAM, "key", "after").unwrap();
    let rest = take(&mut shard, 3).await;
    assert_eq!(
        texts(&rest),
        ["u2", "u3", "after"],
        "no user record repeated or skipped"
    );
    assert_eq!(rest[0].sub_sequence_number(), Some(2));
    assert_eq!(reopened_at(&memory), renewed_after(&aggregate));
    assert_eq!(memory.call_count(Operation::GetRecords), 3);
}

/// A de-aggregating reader opened inside an aggregate whose first iterator expires before
/// its first read re-opens at the same point: the aggregate's user records up to the
/// opening one stay skipped.
#[tokio::test(start_paused = true)]
async fn a_reader_opened_inside_an_aggregate_whose_first_iterator_expires_still_skips_into_it() {
    let (memory, api) = kinesis_with(1);
    let users = [
        ("key", None, &b"u0"[..]),
        ("key", None, b"u1"),
        ("key", None, b"u2"),
    ];
    let (_, aggregate) = memory.put(STREAM, "key", aggregate(users)).unwrap();
    memory.put(STREAM, "key", "after").unwrap();
    let start = StartingPoint::AfterSubSequence(aggregate, 0);
    let mut shard = open(
        &api,
        ReadSettings::default().deaggregate(true),
        start.clone(),
    );
    assert!(shard.prime().await);
    outlive_the_iterator().await;
    let read = take(&mut shard, 3).await;
    assert_eq!(texts(&read), ["u1", "u2", "after"]);
    assert_eq!(reopened_at(&memory), [start.clone(), start]);
}

/// `prime()` after a failed attempt (a transient GetShardIterator failure) fixes the position
/// at the next call. Before, every later call returned false without asking ("the first
/// iterator was already fetched and lost"), so a caller retrying until true looped forever.
/// A LATEST start asked again opens at the time of the first request (nothing written since
/// is skipped), and an expiry before the first read re-opens exactly there.
#[tokio::test(start_paused = true)]
async fn prime_after_a_failed_attempt_fixes_the_position() {
    for start in [StartingPoint::Latest, StartingPoint::TrimHorizon] {
        let (memory, api) = kinesis_with(0);
        memory.inject(Fault::fail(Operation::GetShardIterator, "500"));
        let mut shard = open(&api, ReadSettings::default(), start.clone());
        assert!(!shard.prime().await, "{start:?}: the first attempt fails");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            shard.prime().await,
            "{start:?}: the second attempt fixes it"
        );
        // The iterator expires before the first read.
        outlive_the_iterator().await;
        memory.put(STREAM, "key", "new").unwrap();
        assert_eq!(text(&take(&mut shard, 1).await[0]), "new", "{start:?}");
        let opened = reopened_at(&memory);
        assert_eq!(opened.len(), 3, "{start:?}: {opened:?}");
        assert_eq!(opened[0], start);
        assert_eq!(
            opened[1], opened[2],
            "the expiry re-opens where the iterator was"
        );
        if start == StartingPoint::Latest {
            assert!(
                matches!(opened[1], StartingPoint::AtTimestamp(_)),
                "{opened:?}"
            );
        } else {
            assert_eq!(opened[1], start);
        }
    }
}

/// A fan-out reader whose subscription is refused for now reads by GetRecords (it bridges);
/// an expired iterator there goes on after the last record read too.
#[tokio::test(start_paused = true)]
async fn a_bridging_fan_out_reader_goes_on_after_an_expiry_from_the_last_record_read() {
    let (memory, api) = kinesis_with(60);
    memory.inject(Fault::throttle(Operation::SubscribeToShard).times(u32::MAX));
    let mut shard = open(
        &api,
        ReadSettings::default().fan_out("app").batch_size(10),
        StartingPoint::TrimHorizon,
    );
    let read = take(&mut shard, 40).await;
    GoesOnAfterTheStall {
        count: 20,
        first: "r40",
        last: "r59",
        reads: 7,
        why: "four reads, the expired one, two reads of the 20 new records",
    }
    .check(&memory, &mut shard, &read[39])
    .await;
}

/// The sequence number of the `index`th record, as a TRIM_HORIZON reader sees it.
async fn memory_seq(api: &SharedKinesis, index: usize) -> String {
    let it = api
        .get_shard_iterator(STREAM, SHARD0, &StartingPoint::TrimHorizon)
        .await
        .unwrap();
    let out = api
        .get_records(STREAM, &Arc::from(SHARD0), it, 10_000)
        .await
        .unwrap();
    out.records[index].sequence_number().to_owned()
}

#[tokio::test(start_paused = true)]
async fn an_expired_latest_iterator_reopens_at_its_issue_time_not_at_latest() {
    let (memory, api) = kinesis_with(2);
    // Reads in place, so the reader stalls with its consumer (a background read would keep
    // the iterator chain fresh through empty reads, and never reach this recovery).
    let settings = ReadSettings::default().background_reads(false);
    let mut shard = open(&api, settings, StartingPoint::Latest);
    assert!(
        timeout(Duration::from_millis(100), shard.next())
            .await
            .is_err(),
        "nothing yet"
    );
    memory.put(STREAM, "key", "new-1").unwrap();
    memory.put(STREAM, "key", "new-2").unwrap();
    // The consumer stalls for longer than an iterator lives.
    tokio::time::sleep(Duration::from_secs(400)).await;
    // The new iterator opens at the time the first one was issued, less the clock-skew
    // allowance (5 s): the two records written just before it are read as well, and nothing
    // written after it is skipped.
    let read = take(&mut shard, 4).await;
    assert_eq!(
        texts(&read),
        ["r0", "r1", "new-1", "new-2"],
        "nothing skipped"
    );
    let opened = reopened_at(&memory);
    assert_eq!(opened[0], StartingPoint::Latest);
    assert!(
        matches!(opened[1], StartingPoint::AtTimestamp(_)),
        "{opened:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_expiry_recovery_opens_at_latest() {
    // One reader per recovery path; after each, the renewed iterators are never LATEST.
    let (memory, api) = kinesis_with(4);
    let mut shard = open(
        &api,
        ReadSettings::default().batch_size(1),
        StartingPoint::Latest,
    );
    assert!(
        timeout(Duration::from_millis(10), shard.next())
            .await
            .is_err()
    );
    memory.put(STREAM, "key", "a").unwrap();
    for _ in 0..3 {
        outlive_the_iterator().await;
        memory.put(STREAM, "key", "b").unwrap();
        let _ = take(&mut shard, 1).await;
    }
    let opened = reopened_at(&memory);
    assert!(opened.len() >= 3, "{opened:?}");
    assert!(
        opened[1..].iter().all(|p| *p != StartingPoint::Latest),
        "{opened:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_aggregated_record_is_reported_and_reading_goes_on() {
    let (memory, api) = kinesis_with(0);
    memory.put(STREAM, "key", "plain-1").unwrap();
    let mut aggregated = KPL_MAGIC.to_vec();
    aggregated.extend_from_slice(b"protobuf...");
    let (_, agg_seq) = memory.put(STREAM, "key", aggregated).unwrap();
    memory.put(STREAM, "key", "plain-2").unwrap();
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
    assert_eq!(text(&take(&mut shard, 1).await[0]), "plain-1");
    match shard.next().await {
        Some(Err(KinesisError::AggregatedRecord {
            shard,
            sequence_number,
            stream,
        })) => {
            assert_eq!(shard, SHARD0);
            assert_eq!(stream, STREAM);
            assert_eq!(sequence_number, agg_seq);
        }
        other => panic!("expected AggregatedRecord, got {other:?}"),
    }
    assert_eq!(text(&take(&mut shard, 1).await[0]), "plain-2");
}

#[tokio::test(start_paused = true)]
async fn no_read_is_issued_while_the_stream_is_not_polled() {
    let (memory, api) = kinesis_with(10);
    let mut shard = open(
        &api,
        ReadSettings::default().batch_size(2),
        StartingPoint::TrimHorizon,
    );
    take(&mut shard, 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(memory.call_count(Operation::GetRecords), 1);
    assert_eq!(shard.buffered_len(), 1, "at most one answer is buffered");
    take(&mut shard, 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        memory.call_count(Operation::GetRecords),
        1,
        "the buffer is drained first"
    );
    take(&mut shard, 1).await;
    assert_eq!(memory.call_count(Operation::GetRecords), 2);
}

#[tokio::test(start_paused = true)]
async fn a_closed_shard_ends_with_its_children() {
    let (memory, api) = kinesis_with(3);
    memory
        .split_shard(STREAM, SHARD0, &(u128::MAX / 2).to_string())
        .await
        .unwrap();
    memory.put(STREAM, "key", "child").unwrap();
    let mut shard = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
    let read = take(&mut shard, 3).await;
    assert!(shard.next().await.is_none());
    let end = shard.shard_end().expect("shard end");
    assert_eq!(end.child_shards.len(), 2);
    assert_eq!(
        end.last_sequence_number.as_deref(),
        Some(read[2].sequence_number())
    );
}

#[tokio::test(start_paused = true)]
async fn invalid_settings_are_refused_when_opening() {
    let (_memory, api) = kinesis_with(0);
    let err = ShardStream::builder(api, STREAM, SHARD0)
        .settings(ReadSettings::default().batch_size(20_000))
        .open(StartingPoint::Latest)
        .unwrap_err();
    assert!(
        matches!(
            err,
            KinesisError::InvalidConfig {
                setting: "batch_size",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn shard_streams_are_send_and_static() {
    fn check<T: Send + 'static>() {}
    check::<ShardStream>();
    check::<Record>();
    check::<KinesisError>();
}

#[tokio::test(start_paused = true)]
async fn a_subscription_opening_many_idle_shards_spreads_their_first_reads() {
    use kinesis_dataflow::{MemoryLeaseStore, Subscription};
    const SHARDS: usize = 200;
    let (memory, api) = kinesis_with_shards(SHARDS);
    let mut sub = Subscription::builder(api, Arc::new(MemoryLeaseStore::new()), STREAM)
        .owner("one")
        .start()
        .await
        .unwrap();
    assert_eq!(sub.shards().len(), SHARDS);
    assert!(timeout(Duration::from_secs(3), sub.next()).await.is_err());
    let reads = calls_of(&memory, Operation::GetRecords);
    let mut first: std::collections::BTreeMap<String, tokio::time::Instant> = Default::default();
    for call in &reads {
        first.entry(call.shard.clone().unwrap()).or_insert(call.at);
    }
    assert_eq!(first.len(), SHARDS, "every shard read within 3 s");
    let mut at_once: std::collections::BTreeMap<tokio::time::Instant, usize> = Default::default();
    for at in first.values() {
        *at_once.entry(*at).or_default() += 1;
    }
    let most = at_once.values().copied().max().unwrap_or(0);
    assert!(
        most <= 3,
        "{most} of {SHARDS} shards opened together had their first read at the same instant"
    );
    // Spread, not delayed: the last first read within one poll interval of the first.
    let span = *first.values().max().unwrap() - *first.values().min().unwrap();
    assert!(span <= Duration::from_secs(1), "{span:?}");
}

/// A call that never answers (a half-open connection) does not stop the shard: the reader
/// gives it up after its call timeout, says so on the stream as a retried failure, and reads
/// on. GetShardIterator and GetRecords alike.
#[tokio::test(start_paused = true)]
async fn a_call_that_never_answers_is_given_up_and_reading_goes_on() {
    for operation in [Operation::GetShardIterator, Operation::GetRecords] {
        let (memory, api) = kinesis_with(2);
        memory.inject(Fault::latency(operation, Duration::from_secs(24 * 3600)));
        let mut stream = open(&api, ReadSettings::default(), StartingPoint::TrimHorizon);
        let mut records = Vec::new();
        let mut failures = Vec::new();
        while records.len() < 2 {
            match timeout(Duration::from_secs(600), stream.next()).await {
                Ok(Some(Ok(record))) => records.push(record),
                Ok(Some(Err(e))) => failures.push(e),
                Ok(None) => panic!("the stream ended"),
                Err(_) => panic!("{operation:?} hung the reader: {failures:?}"),
            }
        }
        assert_eq!(failures.len(), 1, "{operation:?}: {failures:?}");
        assert!(failures[0].is_retryable(), "{:?}", failures[0]);
        assert!(
            failures[0].to_string().contains("no answer within"),
            "{}",
            failures[0]
        );
    }
}
