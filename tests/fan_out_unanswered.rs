//! An enhanced fan-out reader whose calls never answer, or whose subscription goes silent (a
//! connection gone half-open: no event, no error, no end), on the in-memory transport with
//! paused time. Each call is given up after `READ_CALL_TIMEOUT`, and a subscription silent
//! for `SUBSCRIPTION_IDLE_LIMIT` is replaced, so the shard is read on; an idle shard is not
//! churned by the limit. The silent subscription comes from a layer over the transport
//! (`KinesisLayer::subscribe_to_shard`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::layer::{KinesisLayer, Layered};
use kinesis_dataflow::api::memory::Fault;
use kinesis_dataflow::api::{ApiFuture, KinesisApi, ShardEvents, SharedKinesis};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::shard::SUBSCRIPTION_IDLE_LIMIT;
use kinesis_dataflow::{KinesisError, MemoryKinesis, ReadSettings, ShardStream, StartingPoint};
use tokio::time::timeout;

const STREAM: &str = "events";
const SHARD0: &str = "shardId-000000000000";
/// Longer than any call is delayed by in these tests that expect the reader to give it up.
const A_DAY: Duration = Duration::from_secs(24 * 3600);

fn kinesis() -> (MemoryKinesis, SharedKinesis) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let shared: SharedKinesis = Arc::new(memory.clone());
    (memory, shared)
}

fn fan_out(api: SharedKinesis, start: StartingPoint) -> ShardStream {
    ShardStream::builder(api, STREAM, SHARD0)
        .settings(ReadSettings::default().fan_out("app"))
        .open(start)
        .unwrap()
}

/// The next record's payload within `secs`, with the errors reported before it; `Err` when
/// none came in time or the stream ended.
async fn next_text(
    stream: &mut ShardStream,
    secs: u64,
) -> Result<(String, Vec<KinesisError>), String> {
    let mut errors = Vec::new();
    let within = timeout(Duration::from_secs(secs), async {
        loop {
            match stream.next().await {
                Some(Ok(r)) => return Ok(String::from_utf8(r.data().to_vec()).unwrap()),
                Some(Err(e)) => errors.push(e),
                None => return Err("ended".to_owned()),
            }
        }
    })
    .await;
    match within {
        Ok(Ok(text)) => Ok((text, errors)),
        Ok(Err(ended)) => Err(ended),
        Err(_) => Err(format!("nothing within {secs} s; errors {errors:?}")),
    }
}

/// The payload of the next record within `secs`.
async fn next_payload(stream: &mut ShardStream, secs: u64) -> Result<String, String> {
    next_text(stream, secs).await.map(|(text, _)| text)
}

/// Reads "a", then makes the next `operation` call never answer while the subscription is
/// idle and caught up (the reader confirms the shard is not ended with one GetShardIterator and
/// one GetRecords), writes "b" five seconds later, and reads it.
async fn the_end_probe_never_answers(operation: Operation) {
    let (memory, api) = kinesis();
    memory.put(STREAM, "k", "a").unwrap();
    let mut shard = fan_out(api, StartingPoint::TrimHorizon);
    assert_eq!(next_payload(&mut shard, 60).await.unwrap(), "a");
    memory.inject(Fault::latency(operation, A_DAY));
    let put = memory.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        put.put(STREAM, "k", "b").unwrap();
    });
    let (b, errors) = next_text(&mut shard, 600).await.unwrap();
    assert_eq!(b, "b");
    assert!(
        errors.is_empty(),
        "a failed probe is not reported: {errors:?}"
    );
    assert_eq!(
        memory.call_count(operation),
        1,
        "the probe ran into the fault"
    );
}

/// The idle end probe's GetRecords never answers: before, the reader waited on it forever.
#[tokio::test(start_paused = true)]
async fn an_end_probe_get_records_that_never_answers_is_given_up() {
    the_end_probe_never_answers(Operation::GetRecords).await;
}

/// The idle end probe's GetShardIterator never answers: before, the reader waited on it
/// forever.
#[tokio::test(start_paused = true)]
async fn an_end_probe_get_shard_iterator_that_never_answers_is_given_up() {
    the_end_probe_never_answers(Operation::GetShardIterator).await;
}

/// The first call of `operation` never answers: it is given up after the call timeout,
/// reported as a failed call, and the reader reads "a" after the failure backoff.
async fn the_first_call_never_answers(operation: Operation) {
    let (memory, api) = kinesis();
    memory.put(STREAM, "k", "a").unwrap();
    memory.inject(Fault::latency(operation, A_DAY));
    let mut shard = fan_out(api, StartingPoint::TrimHorizon);
    let (a, errors) = next_text(&mut shard, 600).await.unwrap();
    assert_eq!(a, "a");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        matches!(&errors[0], KinesisError::Service { operation: o, message, .. }
            if *o == operation && message.contains("no answer within")),
        "{errors:?}"
    );
}

/// Before, a SubscribeToShard call that never answered held the shard unread forever.
#[tokio::test(start_paused = true)]
async fn a_subscribe_to_shard_that_never_answers_is_given_up() {
    the_first_call_never_answers(Operation::SubscribeToShard).await;
}

/// Before, the consumer's registration (its DescribeStreamConsumer) never ended.
#[tokio::test(start_paused = true)]
async fn a_describe_stream_consumer_that_never_answers_is_given_up() {
    the_first_call_never_answers(Operation::DescribeStreamConsumer).await;
}

/// The consumer is missing, and the RegisterStreamConsumer that creates it never answers.
#[tokio::test(start_paused = true)]
async fn a_register_stream_consumer_that_never_answers_is_given_up() {
    the_first_call_never_answers(Operation::RegisterStreamConsumer).await;
}

/// `prime()` of a fan-out reader opened at a sequence number checks it with one
/// GetShardIterator; one that never answers makes `prime()` return false (not hang), and the
/// next `prime()` fixes the position.
#[tokio::test(start_paused = true)]
async fn a_prime_check_that_never_answers_is_given_up() {
    let (memory, api) = kinesis();
    let (_, first) = memory.put(STREAM, "k", "a").unwrap();
    memory.put(STREAM, "k", "b").unwrap();
    memory.inject(Fault::latency(Operation::GetShardIterator, A_DAY));
    let mut shard = fan_out(api, StartingPoint::AfterSequence(first));
    let primed = timeout(Duration::from_secs(600), shard.prime()).await;
    assert_eq!(primed, Ok(false), "given up, not hung");
    assert!(shard.prime().await);
    assert_eq!(next_payload(&mut shard, 60).await.unwrap(), "b");
}

/// `prime()` of a fan-out reader opened at LATEST subscribes; a SubscribeToShard that never
/// answers makes it return false, and the next one subscribes.
#[tokio::test(start_paused = true)]
async fn a_latest_prime_whose_subscription_never_answers_is_given_up() {
    let (memory, api) = kinesis();
    memory.inject(Fault::latency(Operation::SubscribeToShard, A_DAY));
    let mut shard = fan_out(api, StartingPoint::Latest);
    let primed = timeout(Duration::from_secs(600), shard.prime()).await;
    assert_eq!(primed, Ok(false), "given up, not hung");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(shard.prime().await);
    memory.put(STREAM, "k", "after").unwrap();
    assert_eq!(next_payload(&mut shard, 60).await.unwrap(), "after");
}

/// A layer whose subscriptions go silent after their first `events` events (a connection
/// gone half-open: no further event, no error, no end), as the SDK lets an event stream be.
struct Silent {
    events: usize,
}

impl KinesisLayer for Silent {
    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, ShardEvents> {
        Box::pin(async move {
            let events = inner
                .subscribe_to_shard(stream, consumer_arn, shard, start)
                .await?;
            Ok(events
                .take(self.events)
                .chain(futures::stream::pending())
                .boxed())
        })
    }
}

/// Before, a subscription gone silent after its first event held the shard unread forever
/// (while a subscription's lease would be renewed). Now the silence is reported as a lost
/// connection, and the reader subscribes again after the last event: "b" is read, once.
#[tokio::test(start_paused = true)]
async fn a_subscription_gone_silent_is_replaced_after_the_idle_limit() {
    let (memory, _) = kinesis();
    memory.put(STREAM, "k", "a").unwrap();
    let api: SharedKinesis = Arc::new(Layered::over(memory.clone(), Silent { events: 1 }));
    let mut shard = fan_out(api, StartingPoint::TrimHorizon);
    assert_eq!(next_payload(&mut shard, 60).await.unwrap(), "a");
    memory.put(STREAM, "k", "b").unwrap();
    let limit = SUBSCRIPTION_IDLE_LIMIT.as_secs();
    let (b, errors) = next_text(&mut shard, limit + 60).await.unwrap();
    assert_eq!(b, "b");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        matches!(&errors[0], KinesisError::Service { operation: Operation::SubscribeToShard, message, .. }
            if message.contains("no event within")),
        "{errors:?}"
    );
    assert_eq!(memory.call_count(Operation::SubscribeToShard), 2);
    memory.put(STREAM, "k", "c").unwrap();
    let (c, _) = next_text(&mut shard, limit + 60).await.unwrap();
    assert_eq!(c, "c", "nothing repeated");
}

/// Idle shards on the in-memory transport, for twelve minutes (six idle limits): one never
/// written to (its subscriptions send no event at all) and one read to its tip (its
/// subscriptions send an empty event every second, as the service's do). Neither reports
/// anything or stops; the first is subscribed to again once per idle limit, the second only
/// when the transport ends a subscription (every five minutes); both then read the next
/// record.
#[tokio::test(start_paused = true)]
async fn idle_shards_are_not_churned_by_the_idle_limit() {
    for written in [false, true] {
        let (memory, api) = kinesis();
        if written {
            memory.put(STREAM, "k", "a").unwrap();
        }
        let mut shard = fan_out(api, StartingPoint::TrimHorizon);
        if written {
            assert_eq!(next_payload(&mut shard, 60).await.unwrap(), "a");
        }
        let subscribed = memory.call_count(Operation::SubscribeToShard);
        let idle = SUBSCRIPTION_IDLE_LIMIT * 6;
        let waited = timeout(idle, shard.next()).await;
        assert!(waited.is_err(), "written {written}: {waited:?}");
        let again = memory.call_count(Operation::SubscribeToShard) - subscribed;
        let every = if written {
            kinesis_dataflow::api::memory::DEFAULT_SUBSCRIPTION_LIFETIME
        } else {
            SUBSCRIPTION_IDLE_LIMIT
        };
        let most = (idle.as_secs() / every.as_secs()) as usize;
        assert!(
            again <= most,
            "written {written}: {again} subscriptions in {idle:?}, at most {most} expected"
        );
        memory.put(STREAM, "k", "after").unwrap();
        let (after, errors) = next_text(&mut shard, 60).await.unwrap();
        assert_eq!(after, "after", "written {written}");
        assert!(errors.is_empty(), "written {written}: {errors:?}");
    }
}
