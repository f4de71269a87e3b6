//! The broker face over the in-memory transport, driven through the framework's traits:
//! settlement, context keys, publishing rules, startup checks and shutdown.

use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::broker::{
    ConnectedKinesis, KinesisBroker, KinesisContext, KinesisOptions, KinesisStream,
    KinesisSubscriber, PartitionKey, SequenceNumber, ShardId, StreamName,
};
use kinesis_dataflow::{KinesisError, MemoryKinesis};
use ruststream::{
    Broker, BuildContext, ConnectedBroker, ContextField, HeaderMap, IncomingMessage,
    OutgoingMessage, Publisher, Subscriber, SubscriptionSource,
};

const WAIT: Duration = Duration::from_secs(10);

fn stream(name: &str) -> KinesisStream {
    KinesisStream::new(name).poll_interval(Duration::from_millis(20))
}

async fn next<S: Subscriber>(sub: &mut S) -> S::Message {
    tokio::time::timeout(WAIT, Box::pin(sub.stream()).next())
        .await
        .expect("a delivery in time")
        .expect("the stream goes on")
        .expect("no error")
}

async fn publish(
    c: &kinesis_dataflow::broker::ConnectedKinesis,
    stream: &str,
    key: &str,
    body: &str,
) {
    c.publisher()
        .publish(
            OutgoingMessage::new(stream, body.as_bytes()),
            Some(&KinesisOptions::partition_key(key)),
        )
        .await
        .unwrap();
}

/// Connects to `kinesis` and subscribes "payments", whose records go to the stream "dead"
/// after `max_attempts`, and "dead".
async fn payments_with_dead_letters(
    kinesis: &MemoryKinesis,
    max_attempts: u32,
) -> (ConnectedKinesis, KinesisSubscriber, KinesisSubscriber) {
    kinesis.add_stream("dead", 1).unwrap();
    let c = KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap();
    let declared = ruststream::RetryDeclaration::new()
        .with_max_attempts(std::num::NonZeroU32::new(max_attempts).unwrap())
        .with_dead_letter("dead");
    let sub = stream("payments")
        .create_if_missing(1)
        .declare_retry(&declared)
        .subscribe(&c)
        .await
        .unwrap();
    let dead = stream("dead").subscribe(&c).await.unwrap();
    (c, sub, dead)
}

/// A connected in-memory broker with an `orders` stream of one shard, subscribed to, and
/// four records published to it (`one` to `four`, keys `k0` to `k3`).
async fn orders_with_four_records() -> (ConnectedKinesis, KinesisSubscriber) {
    let kinesis = MemoryKinesis::new();
    let c = KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap();
    let sub = stream("orders")
        .create_if_missing(1)
        .subscribe(&c)
        .await
        .unwrap();
    for (i, body) in ["one", "two", "three", "four"].iter().enumerate() {
        publish(&c, "orders", &format!("k{i}"), body).await;
    }
    (c, sub)
}

/// ack: the first delivery, with its context keys.
async fn an_ack_with_the_context_keys(sub: &mut KinesisSubscriber) {
    let one = next(sub).await;
    assert_eq!(one.payload(), b"one");
    assert_eq!(one.redelivery_count(), Some(1));
    assert_eq!(one.partition_key(), Some(&b"k0"[..]));
    let ctx = KinesisContext::build(&one);
    assert_eq!(&*StreamName.read(&ctx), "orders");
    assert_eq!(&*ShardId.read(&ctx), "shardId-000000000000");
    assert_eq!(PartitionKey.read(&ctx), "k0");
    assert!(!SequenceNumber.read(&ctx).is_empty());
    assert!(ctx.arrival.is_some());
    assert!(ctx.millis_behind_latest.is_some());
    one.ack().await.unwrap();
}

/// retry: the same record again, before anything later, counted.
async fn a_retry_comes_back_first(sub: &mut KinesisSubscriber) {
    let two = next(sub).await;
    assert_eq!(two.payload(), b"two");
    two.nack(true).await.unwrap();
    let two = next(sub).await;
    assert_eq!(two.payload(), b"two");
    assert_eq!(two.redelivery_count(), Some(2));
    two.ack().await.unwrap();
}

/// drop: skipped, never back.
async fn a_drop_is_skipped(sub: &mut KinesisSubscriber) {
    let three = next(sub).await;
    assert_eq!(three.payload(), b"three");
    three.nack(false).await.unwrap();
}

/// retry_after: back no sooner than the delay; then an unsettled drop comes back.
async fn a_retry_after_then_an_unsettled_drop_come_back(sub: &mut KinesisSubscriber) {
    let four = next(sub).await;
    assert_eq!(four.payload(), b"four");
    assert!(four.supports_nack_after());
    let sent_back = tokio::time::Instant::now();
    four.nack_after(Duration::from_millis(300)).await.unwrap();
    let four = next(sub).await;
    assert_eq!(four.payload(), b"four");
    assert!(sent_back.elapsed() >= Duration::from_millis(300));
    assert_eq!(four.redelivery_count(), Some(2));

    drop(four);
    let four = next(sub).await;
    assert_eq!(four.payload(), b"four");
    assert_eq!(four.redelivery_count(), Some(3));
    four.ack().await.unwrap();
}

/// Nothing else is delivered.
async fn nothing_else(sub: &mut KinesisSubscriber) {
    assert!(
        tokio::time::timeout(Duration::from_millis(300), Box::pin(sub.stream()).next())
            .await
            .is_err()
    );
}

/// Headers ride in the envelope.
async fn headers_ride_in_the_envelope(c: &ConnectedKinesis, sub: &mut KinesisSubscriber) {
    let mut headers = HeaderMap::new();
    headers.insert("x-trace", "abc");
    c.publisher()
        .publish(
            OutgoingMessage::new("orders", &b"five"[..]).with_headers(headers),
            None,
        )
        .await
        .unwrap();
    let five = next(sub).await;
    assert_eq!(five.payload(), b"five");
    assert_eq!(five.headers().get("x-trace"), Some(&b"abc"[..]));
    five.ack().await.unwrap();
}

/// After shutdown: handles refuse, the stream ends.
async fn after_shutdown_handles_refuse(c: &ConnectedKinesis, sub: &mut KinesisSubscriber) {
    publish(c, "orders", "k", "six").await;
    let six = next(sub).await;
    let closed = c.clone().shutdown().await.unwrap();
    assert_eq!(closed.subscriptions_stopped, 1);
    assert!(
        six.ack().await.is_err(),
        "an ack after shutdown cannot be promised"
    );
    assert!(Box::pin(sub.stream()).next().await.is_none());
    let refused = c
        .publisher()
        .publish(OutgoingMessage::new("orders", &b"x"[..]), None)
        .await;
    assert!(
        matches!(refused, Err(KinesisError::ShutDown)),
        "{refused:?}"
    );
    let refused = stream("orders").subscribe(c).await;
    assert!(matches!(refused, Err(KinesisError::ShutDown)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_maps_onto_the_shard() {
    let (c, mut sub) = orders_with_four_records().await;
    an_ack_with_the_context_keys(&mut sub).await;
    a_retry_comes_back_first(&mut sub).await;
    a_drop_is_skipped(&mut sub).await;
    a_retry_after_then_an_unsettled_drop_come_back(&mut sub).await;
    nothing_else(&mut sub).await;
    headers_ride_in_the_envelope(&c, &mut sub).await;
    after_shutdown_handles_refuse(&c, &mut sub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_refuses_bad_settings_and_missing_streams() {
    let c = KinesisBroker::in_memory(MemoryKinesis::new())
        .connect()
        .await
        .unwrap();
    let err = KinesisStream::new("s")
        .create_if_missing(0)
        .subscribe(&c)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("create_if_missing"), "{err}");
    let err = KinesisStream::new("s")
        .poll_interval(Duration::ZERO)
        .subscribe(&c)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("poll_interval"), "{err}");
    let err = KinesisStream::new("").subscribe(&c).await.unwrap_err();
    assert!(err.to_string().contains("`name`"), "{err}");
    let err = KinesisStream::new("missing")
        .subscribe(&c)
        .await
        .unwrap_err();
    assert!(matches!(err, KinesisError::StreamNotFound { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_refuses_what_the_service_refuses() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("events", 1).unwrap();
    let c = KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap();
    let p = c.publisher();
    let empty_key = p
        .publish(
            OutgoingMessage::new("events", &b"x"[..]),
            Some(&KinesisOptions::partition_key("")),
        )
        .await;
    assert!(
        matches!(empty_key, Err(KinesisError::InvalidRecord { .. })),
        "{empty_key:?}"
    );
    let long_key = p
        .publish(
            OutgoingMessage::new("events", &b"x"[..]),
            Some(&KinesisOptions::partition_key("k".repeat(257))),
        )
        .await;
    assert!(
        matches!(long_key, Err(KinesisError::InvalidRecord { .. })),
        "{long_key:?}"
    );
    let big = vec![0u8; 1024 * 1024 + 1];
    let too_big = p
        .publish(OutgoingMessage::new("events", &big[..]), None)
        .await;
    assert!(
        matches!(too_big, Err(KinesisError::InvalidRecord { .. })),
        "{too_big:?}"
    );
    let unknown = p
        .publish(OutgoingMessage::new("nope", &b"x"[..]), None)
        .await;
    assert!(
        matches!(unknown, Err(KinesisError::StreamNotFound { .. })),
        "{unknown:?}"
    );
    // A policy key applies to publishes that name none.
    use ruststream::PublishPolicy;
    let keyed = kinesis_dataflow::broker::KinesisPublish::default()
        .partition_key("fixed")
        .pair(&c)
        .await
        .unwrap();
    keyed
        .publish(OutgoingMessage::new("events", &b"y"[..]), None)
        .await
        .unwrap();
    let records = kinesis.records("events", "shardId-000000000000").unwrap();
    assert_eq!(records.last().unwrap().partition_key(), "fixed");
    c.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_name_subscriptions_use_the_broker_defaults() {
    use ruststream::Subscribe;
    let kinesis = MemoryKinesis::new();
    // Without `create_missing_streams`, a missing stream is an error naming the fix.
    let c = KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap();
    let err = Subscribe::subscribe(&c, "by-name").await.unwrap_err();
    assert!(err.to_string().contains("create_if_missing"), "{err}");
    c.shutdown().await.unwrap();

    let c = KinesisBroker::in_memory(kinesis.clone())
        .create_missing_streams(3)
        .connect()
        .await
        .unwrap();
    let sub = Subscribe::subscribe(&c, "by-name").await.unwrap();
    let summary = kinesis_dataflow::api::KinesisApi::describe_stream_summary(&kinesis, "by-name")
        .await
        .unwrap();
    assert_eq!(summary.open_shard_count, 3);
    drop(sub);
    c.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_spent_on_its_attempts_goes_to_the_dead_letter_stream_as_it_was() {
    use kinesis_dataflow::broker::dead_letters::{
        ATTEMPTS_HEADER, LAST_ERROR_HEADER, ORIGIN_SEQUENCE_HEADER, ORIGIN_SHARD_HEADER,
        ORIGIN_STREAM_HEADER,
    };
    let kinesis = MemoryKinesis::new();
    let (c, mut sub, mut dead) = payments_with_dead_letters(&kinesis, 2).await;
    let mut headers = HeaderMap::new();
    headers.insert("x-trace", "abc");
    c.publisher()
        .publish(
            OutgoingMessage::new("payments", &b"poison"[..]).with_headers(headers),
            Some(&KinesisOptions::partition_key("acct-1")),
        )
        .await
        .unwrap();
    publish(&c, "payments", "acct-1", "after").await;

    let first = next(&mut sub).await;
    let sequence_number = first.record().unwrap().sequence_number().to_owned();
    first.nack(true).await.unwrap();
    let second = next(&mut sub).await;
    assert_eq!(
        (second.payload(), second.redelivery_count()),
        (&b"poison"[..], Some(2))
    );
    second.nack(true).await.unwrap();
    let after = next(&mut sub).await;
    assert_eq!(
        after.payload(),
        b"after",
        "the key's next record comes after it"
    );
    after.ack().await.unwrap();

    let letter = next(&mut dead).await;
    assert_eq!(letter.payload(), b"poison");
    assert_eq!(letter.partition_key(), Some(&b"acct-1"[..]));
    let header = |name: &str| {
        letter
            .headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(
        header("x-trace").as_deref(),
        Some("abc"),
        "its own headers kept"
    );
    assert_eq!(header(ORIGIN_STREAM_HEADER).as_deref(), Some("payments"));
    assert_eq!(
        header(ORIGIN_SHARD_HEADER).as_deref(),
        Some("shardId-000000000000")
    );
    assert_eq!(header(ORIGIN_SEQUENCE_HEADER), Some(sequence_number));
    assert_eq!(header(ATTEMPTS_HEADER).as_deref(), Some("2"));
    assert_eq!(
        header(LAST_ERROR_HEADER),
        None,
        "a plain retry says nothing"
    );
    letter.ack().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_declaration_is_refused_when_half_or_its_stream_is_missing() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("payments", 1).unwrap();
    let c = KinesisBroker::in_memory(kinesis).connect().await.unwrap();
    let two = std::num::NonZeroU32::new(2).unwrap();
    let cases = [
        (
            ruststream::RetryDeclaration::new().with_max_attempts(two),
            "max_attempts",
        ),
        (
            ruststream::RetryDeclaration::new().with_dead_letter("dead"),
            "dead_letter",
        ),
        (
            ruststream::RetryDeclaration::new()
                .with_max_attempts(two)
                .with_dead_letter("no-such-stream"),
            "no-such-stream",
        ),
    ];
    for (declared, named) in cases {
        let err = stream("payments")
            .declare_retry(&declared)
            .subscribe(&c)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(named), "{named}: {err}");
    }
}

/// A spent message whose payload fills a Kinesis record: with the origin headers it would not
/// fit, so its dead letter goes without the payload, naming its size, and the shard goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_too_big_for_a_record_goes_without_its_payload() {
    use kinesis_dataflow::broker::dead_letters::{OMITTED_BYTES_HEADER, ORIGIN_SEQUENCE_HEADER};
    let kinesis = MemoryKinesis::new();
    let (c, mut sub, mut dead) = payments_with_dead_letters(&kinesis, 1).await;
    let size = 1024 * 1024 - "acct-1".len() - 64;
    c.publisher()
        .publish(
            OutgoingMessage::new("payments", &vec![b'x'; size]),
            Some(&KinesisOptions::partition_key("acct-1")),
        )
        .await
        .unwrap();
    publish(&c, "payments", "acct-1", "after").await;

    let first = next(&mut sub).await;
    let sequence_number = first.record().unwrap().sequence_number().to_owned();
    first.nack(true).await.unwrap();
    let after = next(&mut sub).await;
    assert_eq!(after.payload(), b"after", "the shard goes on");
    after.ack().await.unwrap();

    let letter = next(&mut dead).await;
    assert!(letter.payload().is_empty());
    let header = |name: &str| {
        letter
            .headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header(ORIGIN_SEQUENCE_HEADER), Some(sequence_number));
    assert!(
        header(OMITTED_BYTES_HEADER).is_some_and(|n| n.parse::<usize>().unwrap() >= size),
        "{:?}",
        header(OMITTED_BYTES_HEADER)
    );
    letter.ack().await.unwrap();
}

/// A KPL user record's position opens inside its aggregate: seeking to the third user record
/// delivers it again, not the aggregate's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_to_a_user_records_position_delivers_that_user_record() {
    use ruststream::{Positioned, Seekable, Seeker};
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("bundled", 1).unwrap();
    let users: Vec<(&str, Option<&str>, &[u8])> = vec![
        ("u", None, b"u0"),
        ("u", None, b"u1"),
        ("u", None, b"u2"),
        ("u", None, b"u3"),
    ];
    kinesis
        .put("bundled", "outer", kinesis_dataflow::kpl::aggregate(users))
        .unwrap();
    let c = KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap();
    let mut sub = stream("bundled")
        .deaggregate(true)
        .start_at(kinesis_dataflow::KinesisPosition::horizon())
        .subscribe(&c)
        .await
        .unwrap();
    let seeker = sub.seeker();
    let mut third = None;
    for expected in ["u0", "u1", "u2"] {
        let message = next(&mut sub).await;
        assert_eq!(message.payload(), expected.as_bytes());
        if expected == "u2" {
            third = Some(message.position());
        }
        message.ack().await.unwrap();
    }
    seeker.seek(third.unwrap()).await.unwrap();
    let again = next(&mut sub).await;
    assert_eq!(again.payload(), b"u2", "the seek opens at that user record");
    again.ack().await.unwrap();
    assert_eq!(next(&mut sub).await.payload(), b"u3");
}
