//! The broker face's publish settings `collect` and `aggregate` against kinesis-local and
//! dynalite: concurrent publishes through an aggregating publisher are stored as a few KPL
//! aggregates, and a subscriber with `KinesisStream::deaggregate(true)` handles every message
//! once, with its payload intact.

mod support;

use std::collections::BTreeSet;
use std::future::{Future, ready};
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use kinesis_dataflow::broker::prelude::*;
use kinesis_dataflow::publish::{Aggregate, Collect};
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, PublishPolicy, Publisher};

/// Logs each record's data (`handled`) and acks it.
struct Record;

#[derive(Deserialized)]
struct Data<'a>(&'a [u8]);

impl<'p> Handle<Data<'p>, (), (), KinesisContext> for Record {
    fn handle(
        &self,
        data: &Data<'p>,
        _outs: &(),
        ctx: &mut Context<'_, KinesisContext>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(
            stream = ctx.context(StreamName),
            data = %String::from_utf8_lossy(data.0),
            "handled"
        );
        ready(Ok(()))
    }
}

fn handled(stream: &str) -> Vec<String> {
    support::events::events("handled")
        .into_iter()
        .filter(|f| f.get("stream").map(String::as_str) == Some(stream))
        .map(|f| f["data"].clone())
        .collect()
}

/// How many Kinesis records `stream`'s shards hold.
async fn kinesis_records(stream: &str) -> usize {
    let client = support::kinesis_client();
    let mut total = 0;
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        let iterator = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator;
        let page = client
            .get_records()
            .shard_iterator(iterator.unwrap())
            .send()
            .await
            .unwrap();
        total += page.records.len();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_publishes_are_handled_once_each_by_a_deaggregating_subscriber() {
    support::events::record_events();
    let application = support::unique_name("aggregated");
    let stream = support::unique_name("aggregated-stream");
    support::create_stream(&support::kinesis_client(), &stream, 2).await;

    let producer = support::live_broker(&application).connect().await.unwrap();
    let publisher = KinesisPublish::default()
        .collect(Collect::default().linger(Duration::from_millis(50)))
        .aggregate(Aggregate::default())
        .pair(&producer)
        .await
        .unwrap();
    let sent: BTreeSet<String> = (0..60).map(|i| format!("message-{i:02}")).collect();
    let options: Vec<KinesisOptions> = (0..sent.len())
        .map(|i| KinesisOptions::partition_key(format!("key-{}", i % 6)))
        .collect();
    let publishes = sent.iter().zip(&options).map(|(data, options)| {
        publisher.publish(
            OutgoingMessage::new(&stream, data.as_bytes()),
            Some(options),
        )
    });
    for outcome in futures::future::join_all(publishes).await {
        outcome.unwrap();
    }
    let stored = kinesis_records(&stream).await;
    assert!(stored <= 4, "60 messages in {stored} Kinesis records");

    let source = KinesisStream::new(&stream)
        .deaggregate(true)
        .initial_position(KinesisPosition::horizon())
        .poll_interval(Duration::from_millis(100));
    let app = RustStream::new(AppInfo::new("aggregated", "0.1.0")).with_broker(
        support::live_broker(&application),
        |b| {
            b.include(subscriber(source, Record).build());
        },
    );
    let running = app.start().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handled(&stream).len() < sent.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} handled",
            handled(&stream).len(),
            sent.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await.unwrap();
    producer.shutdown().await.unwrap();
    let got = handled(&stream);
    assert_eq!(got.len(), sent.len(), "each once");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), sent);
}
