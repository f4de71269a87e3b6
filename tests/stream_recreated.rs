//! A stream deleted and created again under the same name, with the same lease table: the rows
//! of the old stream's shards (same shard ids) do not stall or skip the new ones (here the old
//! shard 0 was split, so its row says SHARD_END, which would leave the new shard 0 unread).
//! Against kinesis-local and dynalite.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kinesis_dataflow::api::PutRecordsEntry;
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseError, LeaseFuture, SharedLeaseStore};
use kinesis_dataflow::position::{CLOCK_SKEW_ALLOWANCE, Checkpoint};
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, ReadSettings, Subscription, SubscriptionBuilder,
};

fn builder(api: &SharedKinesis, store: &SharedLeaseStore, stream: &str) -> SubscriptionBuilder {
    Subscription::builder(api.clone(), store.clone(), stream)
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(100))
                .unlimited_reads(),
        )
        .list_interval(Duration::from_millis(300))
        .lease_duration(Duration::from_secs(1))
        .checkpoint_interval(Duration::from_millis(100))
}

async fn publish(api: &SharedKinesis, stream: &str, tag: &str) -> BTreeSet<String> {
    let entries: Vec<PutRecordsEntry> = (0..20)
        .map(|i| PutRecordsEntry {
            data: Bytes::from(format!("{tag}-{i:02}")),
            partition_key: format!("key-{i}"),
            explicit_hash_key: None,
        })
        .collect();
    let out = api.put_records(stream, entries).await.unwrap();
    assert_eq!(out.failed_count(), 0);
    (0..20).map(|i| format!("{tag}-{i:02}")).collect()
}

async fn read_all(sub: &mut Subscription, expected: &BTreeSet<String>, what: &str) {
    support::reading::read_until(sub, expected, what, Duration::from_secs(30)).await;
}

/// The clients, a stream name and a lease table of one test.
struct Setup {
    client: aws_sdk_kinesis::Client,
    aws: Arc<AwsKinesis>,
    api: SharedKinesis,
    stream: String,
    store: SharedLeaseStore,
}

impl Setup {
    fn new(prefix: &str) -> Self {
        support::init_tracing();
        let client = support::kinesis_client();
        let aws = Arc::new(AwsKinesis::new(client.clone()));
        let table = support::unique_name(&format!("{prefix}-leases"));
        let store = DynamoLeaseStore::new(support::dynamodb_client(), table).unwrap();
        Self {
            api: aws.clone(),
            aws,
            client,
            stream: support::unique_name(prefix),
            store: Arc::new(store),
        }
    }

    /// The first stream: one shard, split in two, everything read and checkpointed (the
    /// parent's row says SHARD_END) by the subscription returned.
    async fn first_stream_read(&self) -> Subscription {
        let (api, stream) = (&self.api, &self.stream);
        support::create_stream(&self.client, stream, 1).await;
        let mut first = publish(api, stream, "first").await;
        split(&self.aws, &self.client, stream).await;
        first.extend(publish(api, stream, "split").await);
        let mut sub = builder(api, &self.store, stream)
            .start_at(KinesisPosition::horizon())
            .start()
            .await
            .unwrap();
        read_all(&mut sub, &first, "the first stream").await;
        checkpointed(&self.store, stream).await;
        sub
    }

    /// The first stream read and stopped cleanly, then deleted and created again (one shard)
    /// under the same name.
    async fn read_then_created_again(&self) {
        self.first_stream_read().await.shutdown().await;
        delete_and_wait(&self.client, &self.stream).await;
        support::create_stream(&self.client, &self.stream, 1).await;
    }
}

/// Deletes `stream` and waits until it is gone, and a little more: kinesis-local derives a
/// shard's starting sequence number from the second its stream was created (AWS takes seconds
/// to delete and create a stream anyway).
async fn delete_and_wait(client: &aws_sdk_kinesis::Client, stream: &str) {
    client
        .delete_stream()
        .stream_name(stream)
        .send()
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client
        .describe_stream_summary()
        .stream_name(stream)
        .send()
        .await
        .is_ok()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream was never deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

/// Splits shard 0 of `stream` in two and waits until the stream is active again.
async fn split(aws: &AwsKinesis, client: &aws_sdk_kinesis::Client, stream: &str) {
    aws.split_shard(stream, "shardId-000000000000", &(u128::MAX / 2).to_string())
        .await
        .unwrap();
    support::wait_active(client, stream).await;
}

/// Waits until the parent's row of `stream` says SHARD_END and both children's rows hold a
/// sequence number.
async fn checkpointed(store: &SharedLeaseStore, stream: &str) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let rows = store.list(stream).await.unwrap();
            let parent_done = rows.iter().any(|l| {
                l.shard_id == "shardId-000000000000" && l.checkpoint == Some(Checkpoint::ShardEnd)
            });
            let children = rows
                .iter()
                .filter(|l| matches!(l.checkpoint, Some(Checkpoint::Sequence(_))))
                .count();
            if parent_done && children == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("checkpoints written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_created_again_under_the_same_name_is_read_from_its_own_start() {
    let setup = Setup::new("again");
    let Setup {
        api, stream, store, ..
    } = &setup;
    setup.read_then_created_again().await;

    // The same application starts again: the old rows belong to the old stream.
    let mut sub = builder(api, store, stream).start().await.unwrap();
    let second = publish(api, stream, "second").await;
    read_all(&mut sub, &second, "the stream created again").await;
    sub.shutdown().await;
}

/// The stream was created again and split as before, while the earlier stream's children
/// rows were still held (their reader crashed): only the parent's row was free to replace.
/// Those rows say nothing of the new stream, so the new parent is read from its beginning,
/// not passed as if its children had been read past it; then the children, once their rows
/// are replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_created_again_and_split_again_reads_its_parent_while_old_rows_are_held() {
    let setup = Setup::new("again-split");
    let Setup {
        client,
        aws,
        api,
        stream,
        store,
    } = &setup;
    // The parent was handed back at its end; the children's rows stay this instance's.
    setup.first_stream_read().await.abort();

    delete_and_wait(client, stream).await;
    support::create_stream(client, stream, 1).await;
    let mut second = publish(api, stream, "second").await;
    split(aws, client, stream).await;
    second.extend(publish(api, stream, "second-split").await);

    let mut sub = builder(api, store, stream).start().await.unwrap();
    read_all(&mut sub, &second, "the stream created and split again").await;
    sub.shutdown().await;
}

/// Fails the first write of shard 0's new row, whichever call makes it, as a throttled or
/// timed-out write would; every other call goes through.
#[derive(Default)]
struct FirstNewRowFails(AtomicBool);

impl LeaseLayer for FirstNewRowFails {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let row = match call {
            LeaseCall::Create { lease } | LeaseCall::Replace { new: lease, .. } => lease,
            _ => return next,
        };
        if row.shard_id != "shardId-000000000000" || self.0.swap(true, Ordering::SeqCst) {
            return next;
        }
        Box::pin(async move {
            Err(LeaseError::Unavailable {
                table: "(the test's layer)".into(),
                operation: call.operation(),
                message: "the first write of the new row fails".into(),
                source: None,
            })
        })
    }
}

/// The records of the stream created again were written before the application started
/// again, and the first write of shard 0's new row fails. The row of the earlier stream is
/// the only record that the stream was created again: were it deleted before the new row's
/// write, the next listing would find no row and start the shard at the tip, skipping them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_created_again_is_read_from_its_start_when_its_new_row_fails_once() {
    let setup = Setup::new("again-fails");
    let Setup {
        api, stream, store, ..
    } = &setup;
    setup.read_then_created_again().await;
    let second = publish(api, stream, "second").await;
    // Well before the start: the tip it would start at (the start time, less the clock skew
    // allowance) leaves them out.
    tokio::time::sleep(CLOCK_SKEW_ALLOWANCE + Duration::from_millis(1500)).await;

    let layer = Arc::new(FirstNewRowFails::default());
    let faulty: SharedLeaseStore = Arc::new(LayeredStore::new(store.clone(), layer.clone()));
    let mut sub = builder(api, &faulty, stream).start().await.unwrap();
    read_all(&mut sub, &second, "the stream created again").await;
    assert!(layer.0.load(Ordering::SeqCst), "the fault was never met");
    sub.shutdown().await;
}
