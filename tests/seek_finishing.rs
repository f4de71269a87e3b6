//! A seek that races its shard's end: the keeper has written SHARD_END and is handing the
//! lease back (slowly) when the seek moves the shard, so the moved reader hands out a record
//! again that the keeper will never checkpoint. SHARD_END covers it, and whatever waits for
//! its durability (an ack sink's close) must be told so rather than wait for ever. In memory,
//! paused time.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseFuture, SharedLeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{AckSink, KinesisPosition, MemoryKinesis, MemoryLeaseStore};

const STREAM: &str = "ending";
const PARENT: &str = "shardId-000000000000";
const PATIENCE: Duration = Duration::from_secs(120);

/// Holds the parent's lease hand-back for 250 ms (within the call timeout), saying when it
/// began.
struct SlowHandBack(Arc<AtomicBool>);

impl LeaseLayer for SlowHandBack {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if let LeaseCall::Release { lease } = call
            && lease.shard_id == PARENT
            && lease.checkpoint == Some(Checkpoint::ShardEnd)
        {
            let began = self.0.clone();
            return Box::pin(async move {
                began.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(250)).await;
                next.await
            });
        }
        next
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_read_again_by_a_seek_racing_the_shards_end_is_covered_by_it() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    memory.put(STREAM, "k", "r0").unwrap();
    memory
        .split_shard(STREAM, PARENT, "170141183460469231731687303715884105728")
        .await
        .unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let began = Arc::new(AtomicBool::new(false));
    let rows = MemoryLeaseStore::new();
    let store: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(rows.clone()),
        SlowHandBack(began.clone()),
    ));
    let mut sub = support::reading::fast(&api, store, STREAM, "a")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let seeker = sub.seeker();
    let first = tokio::time::timeout(PATIENCE, sub.next())
        .await
        .expect("r0 in time")
        .expect("running")
        .expect("no error");
    assert_eq!(first.data().as_ref(), b"r0");
    first.ack();
    // The shard is read to its end, SHARD_END written, the lease on its way back.
    tokio::time::timeout(PATIENCE, async {
        while !began.load(Ordering::SeqCst) {
            // Polled, the subscription meets the shard's end.
            if let Ok(item) = tokio::time::timeout(Duration::from_millis(5), sub.next()).await {
                panic!("nothing else to read yet: {item:?}");
            }
        }
    })
    .await
    .expect("the hand-back begins");
    let seek = tokio::spawn(async move { seeker.seek(KinesisPosition::horizon()).await });
    let again = tokio::time::timeout(Duration::from_millis(200), sub.next())
        .await
        .expect("the moved reader reads r0 again")
        .expect("running")
        .expect("no error");
    assert_eq!(again.data().as_ref(), b"r0");
    let closed = tokio::time::timeout(
        PATIENCE,
        futures::stream::iter([Ok(again)]).forward(AckSink::new()),
    )
    .await
    .expect("the ack sink's close does not hang");
    assert!(closed.is_ok(), "SHARD_END covers the record: {closed:?}");
    let _ = tokio::time::timeout(PATIENCE, seek)
        .await
        .expect("the seek ends");
    let listed = kinesis_dataflow::lease::LeaseStore::list(&rows, STREAM)
        .await
        .unwrap();
    let parent = listed.iter().find(|l| l.shard_id == PARENT).unwrap();
    assert_eq!(
        parent.checkpoint,
        Some(Checkpoint::ShardEnd),
        "still finished"
    );
    sub.shutdown().await;
}
