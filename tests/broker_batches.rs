//! Batch subscriptions of the broker face over the in-memory transport: what GetRecords asks
//! for, and what a seek does to a batch in the making.

use std::num::NonZeroUsize;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::broker::{ConnectedKinesis, KinesisBroker, KinesisOptions, KinesisStream};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis};
use ruststream::{
    BatchSubscriber, Broker, IncomingMessage, OutgoingMessage, Publisher, Seekable, Seeker,
    SubscriptionSource,
};

const WAIT: Duration = Duration::from_secs(10);

async fn publish(c: &ConnectedKinesis, stream: &str, key: &str, body: &str) {
    c.publisher()
        .publish(
            OutgoingMessage::new(stream, body.as_bytes()),
            Some(&KinesisOptions::partition_key(key)),
        )
        .await
        .unwrap();
}

async fn connect(kinesis: &MemoryKinesis) -> ConnectedKinesis {
    KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap()
}

/// The next batch, within [`WAIT`].
async fn next_batch<S, M>(batches: &mut S) -> Vec<M>
where
    S: futures::Stream<Item = Result<Vec<M>, kinesis_dataflow::KinesisError>> + Unpin,
{
    tokio::time::timeout(WAIT, batches.next())
        .await
        .expect("a batch in time")
        .expect("the stream goes on")
        .expect("no error")
}

fn bodies<M: IncomingMessage>(batch: &[M]) -> Vec<String> {
    batch
        .iter()
        .map(|m| String::from_utf8(m.payload().to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_subscription_asks_get_records_for_its_batch_size() {
    let kinesis = MemoryKinesis::new();
    let c = connect(&kinesis).await;
    let mut sub = KinesisStream::new("orders")
        .poll_interval(Duration::from_millis(20))
        .max_wait(Duration::from_millis(50))
        .create_if_missing(1)
        .subscribe(&c)
        .await
        .unwrap();
    for i in 0..10 {
        publish(&c, "orders", "k", &format!("r{i}")).await;
    }
    let opened = kinesis.calls().len();
    let size = NonZeroUsize::new(6).unwrap();
    let mut batches = Box::pin(sub.batches(size));
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let batch = next_batch(&mut batches).await;
        assert!(batch.len() <= 6);
        seen.extend(bodies(&batch));
        for message in batch {
            message.ack().await.unwrap();
        }
    }
    publish(&c, "orders", "k", "late").await;
    let batch = next_batch(&mut batches).await;
    assert_eq!(bodies(&batch), ["late"]);
    let limits: Vec<Option<u32>> = kinesis.calls()[opened..]
        .iter()
        .filter(|call| call.operation == Operation::GetRecords)
        .map(|call| call.limit)
        .collect();
    assert!(
        !limits.is_empty(),
        "GetRecords was called after the batches opened"
    );
    assert!(
        limits.iter().all(|limit| *limit == Some(6)),
        "GetRecords limits after the batch stream opened: {limits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptors_batch_size_outranks_the_batch_subscriptions() {
    let kinesis = MemoryKinesis::new();
    let c = connect(&kinesis).await;
    let mut sub = KinesisStream::new("orders")
        .poll_interval(Duration::from_millis(20))
        .max_wait(Duration::from_millis(50))
        .batch_size(250)
        .create_if_missing(1)
        .subscribe(&c)
        .await
        .unwrap();
    publish(&c, "orders", "k", "one").await;
    let mut batches = Box::pin(sub.batches(NonZeroUsize::new(6).unwrap()));
    let batch = next_batch(&mut batches).await;
    assert_eq!(bodies(&batch), ["one"]);
    let limits: Vec<Option<u32>> = kinesis
        .calls()
        .iter()
        .filter(|call| call.operation == Operation::GetRecords)
        .map(|call| call.limit)
        .collect();
    assert!(limits.iter().all(|limit| *limit == Some(250)), "{limits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_drops_the_record_a_batch_carried_over() {
    let kinesis = MemoryKinesis::new();
    let c = connect(&kinesis).await;
    let mut sub = KinesisStream::new("orders")
        .poll_interval(Duration::from_millis(20))
        .max_wait(Duration::from_secs(2))
        .create_if_missing(2)
        .subscribe(&c)
        .await
        .unwrap();
    // Keys on both shards, so a batch of one shard closes on the other's first record.
    for i in 0..10 {
        publish(&c, "orders", &format!("k{i}"), &format!("old{i}")).await;
    }
    let seeker = sub.seeker();
    let mut batches = Box::pin(sub.batches(NonZeroUsize::new(100).unwrap()));
    let first = next_batch(&mut batches).await;
    assert!(bodies(&first).iter().all(|b| b.starts_with("old")));
    assert!(
        first.len() < 10,
        "one shard's records: {:?}",
        bodies(&first)
    );
    for message in first {
        message.ack().await.unwrap();
    }
    seeker.seek(KinesisPosition::latest()).await.unwrap();
    publish(&c, "orders", "k0", "fresh").await;
    let next = next_batch(&mut batches).await;
    assert_eq!(bodies(&next), ["fresh"], "nothing from before the seek");
}
