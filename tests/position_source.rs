//! `SubscriptionBuilder::position_source`: a shard opens right after the application's own
//! stored position when that is ahead of the lease table's checkpoint (sub-sequence numbers
//! included), never behind it; `start_at` at startup goes first; a failing source releases
//! the lease with an error item and the shard is taken again. On the in-memory transport.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::lease::{Lease, LeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::subscription::{PositionSourceError, position_source_fn};
use kinesis_dataflow::{
    KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings, Subscription,
};

const STREAM: &str = "effects";
const SHARD: &str = "shardId-000000000000";

/// A one-shard stream holding `r-0..r-9`; their sequence numbers.
fn stream() -> (MemoryKinesis, Vec<String>) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let seqs = (0..10)
        .map(|i| memory.put(STREAM, "k", format!("r-{i}")).unwrap().1)
        .collect();
    (memory, seqs)
}

/// A lease store whose row of the shard holds `checkpoint`.
async fn store_at(checkpoint: Option<Checkpoint>) -> MemoryLeaseStore {
    let store = MemoryLeaseStore::new();
    let mut lease = Lease::new(STREAM, SHARD, Vec::new());
    lease.checkpoint = checkpoint;
    store.create(&lease).await.unwrap();
    store
}

fn subscription(
    memory: &MemoryKinesis,
    store: &MemoryLeaseStore,
) -> kinesis_dataflow::SubscriptionBuilder {
    let api: kinesis_dataflow::api::SharedKinesis = Arc::new(memory.clone());
    support::timings::fast(&api, Arc::new(store.clone()), STREAM, "effects-app")
        .initial_position(KinesisPosition::horizon())
}

/// The first `n` payloads delivered (acked), with any error items before them.
async fn first(sub: &mut Subscription, n: usize) -> (Vec<String>, Vec<KinesisError>) {
    let mut got = Vec::new();
    let mut errors = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while got.len() < n {
            match sub.next().await.expect("the subscription runs") {
                Ok(d) => got.push(String::from_utf8_lossy(&d.ack().data()[..]).into_owned()),
                Err(e) => errors.push(e),
            }
        }
    })
    .await
    .expect("the records come");
    (got, errors)
}

fn source(at: Option<Checkpoint>) -> impl kinesis_dataflow::subscription::PositionSource {
    position_source_fn(move |stream: String, shard: String| {
        assert_eq!((stream.as_str(), shard.as_str()), (STREAM, SHARD));
        let at = at.clone();
        async move { Ok::<_, PositionSourceError>(at) }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_ahead_of_the_lease_table_opens_right_after_its_position() {
    let (memory, seqs) = stream();
    let store = store_at(Some(Checkpoint::Sequence(seqs[2].clone()))).await;
    let mut sub = subscription(&memory, &store)
        .position_source(source(Some(Checkpoint::Sequence(seqs[6].clone()))))
        .start()
        .await
        .unwrap();
    let (got, errors) = first(&mut sub, 3).await;
    assert_eq!(got, ["r-7", "r-8", "r-9"]);
    assert!(errors.is_empty(), "{errors:?}");
    sub.shutdown().await;
    let rows = store.list(STREAM).await.unwrap();
    let row = rows.iter().find(|l| l.shard_id == SHARD).unwrap();
    assert_eq!(row.checkpoint, Some(Checkpoint::Sequence(seqs[9].clone())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_behind_the_lease_table_or_without_a_position_changes_nothing() {
    for at in [Some(Checkpoint::Sequence(String::new())), None] {
        let (memory, seqs) = stream();
        let at = at.map(|_| Checkpoint::Sequence(seqs[1].clone()));
        let store = store_at(Some(Checkpoint::Sequence(seqs[4].clone()))).await;
        let mut sub = subscription(&memory, &store)
            .position_source(source(at))
            .start()
            .await
            .unwrap();
        let (got, _) = first(&mut sub, 5).await;
        assert_eq!(got, ["r-5", "r-6", "r-7", "r-8", "r-9"]);
        sub.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_sequence_position_opens_at_the_next_user_record_of_its_aggregate() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let users: Vec<(String, Option<String>, Vec<u8>)> = (0..5)
        .map(|i| ("k".to_owned(), None, format!("u-{i}").into_bytes()))
        .collect();
    let data = kinesis_dataflow::kpl::aggregate(
        users
            .iter()
            .map(|(k, h, d)| (k.as_str(), h.as_deref(), &d[..])),
    );
    let seq = memory.put(STREAM, "k", data).unwrap().1;
    memory.put(STREAM, "k", "after").unwrap();
    // The lease table knows nothing; the source committed through user record 1; a whole
    // record is further than any of its user records, so `Sequence` would skip them all.
    let store = store_at(Some(Checkpoint::SubSequence(seq.clone(), 0))).await;
    let mut sub = subscription(&memory, &store)
        .read_settings(ReadSettings::default().deaggregate(true).unlimited_reads())
        .position_source(source(Some(Checkpoint::SubSequence(seq, 1))))
        .start()
        .await
        .unwrap();
    let (got, _) = first(&mut sub, 4).await;
    assert_eq!(got, ["u-2", "u-3", "u-4", "after"]);
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_at_goes_first_and_a_failing_source_is_asked_again() {
    let (memory, seqs) = stream();
    let store = store_at(Some(Checkpoint::Sequence(seqs[2].clone()))).await;
    let mut sub = subscription(&memory, &store)
        .start_at(KinesisPosition::horizon())
        .position_source(source(Some(Checkpoint::Sequence(seqs[6].clone()))))
        .start()
        .await
        .unwrap();
    let (got, _) = first(&mut sub, 1).await;
    assert_eq!(got, ["r-0"], "start_at at startup goes ahead of the source");
    sub.shutdown().await;

    let (memory, seqs) = stream();
    let store = store_at(Some(Checkpoint::Sequence(seqs[2].clone()))).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let stored = Checkpoint::Sequence(seqs[7].clone());
    let flaky = position_source_fn(move |_stream: String, _shard: String| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        let stored = stored.clone();
        async move {
            if first {
                return Err::<Option<Checkpoint>, PositionSourceError>("database is locked".into());
            }
            Ok(Some(stored))
        }
    });
    let mut sub = subscription(&memory, &store)
        .position_source(flaky)
        .start()
        .await
        .unwrap();
    let (got, errors) = first(&mut sub, 2).await;
    assert_eq!(got, ["r-8", "r-9"], "nothing before the source's position");
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, KinesisError::PositionSource { .. })
                && e.report().contains("database is locked")),
        "{errors:?}"
    );
    assert!(calls.load(Ordering::SeqCst) >= 2);
    sub.shutdown().await;
}

/// A seek to a sequence number (or a `start_at` one) is recorded in the row as where the
/// reader begins: every record before it is passed over on purpose. A takeover before anything
/// settles must open there, not after an older position of the source (which would deliver
/// what the seek passed over); a source at or past the seek's point still goes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_records_a_seek_to_a_sequence_goes_before_an_older_source_position() {
    use kinesis_dataflow::StartingPoint;
    let cases = [
        (2, ["r-7", "r-8"]), // the source is behind the seek: the seek holds
        (7, ["r-8", "r-9"]), // the source settled the seek's own record: right after it
    ];
    for (stored, expected) in cases {
        let (memory, seqs) = stream();
        let begins = StartingPoint::AtSequence(seqs[7].clone());
        let store = store_at(Some(Checkpoint::Start(begins))).await;
        let mut sub = subscription(&memory, &store)
            .position_source(source(Some(Checkpoint::Sequence(seqs[stored].clone()))))
            .start()
            .await
            .unwrap();
        let (got, errors) = first(&mut sub, 2).await;
        assert_eq!(got, expected, "the source at r-{stored}");
        assert!(errors.is_empty(), "{errors:?}");
        sub.shutdown().await;
    }
}
