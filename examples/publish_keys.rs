// Partition keys, the four ways a publish names one (first match wins):
//
// 1. per publish: `KinesisOptions::partition_key(..)` passed to `Publisher::publish`, or the
//    `.partition_key(..)` step of a publish builder;
// 2. the `partition-key` header (`PARTITION_KEY_HEADER`);
// 3. a key fixed on the publish policy (`KinesisPublish::default().partition_key(..)`; at a
//    mount site the same rule is the `.fixed_partition_key(..)` step after `.out(..)`);
// 4. none of those: a random key per record (the records then spread over the shards and
//    keep no order between them).
//
// `publish_notes` writes notes to the `notes` stream, each the way it names; the app's one
// handler, `show`, logs every note with the partition key its record carries
// (`Ctx<PartitionKey>`) and the shard it landed on (`Ctx<ShardId>`). Notes of one key share a
// shard and arrive in the order they were published.
//
// ```sh
// cargo run --example publish_keys            # on the in-memory transport (four shards)
// cargo run --example publish_keys -- --aws   # on AWS / LocalStack / emulators
// ```
//
// With `--aws` the broker comes from the standard AWS environment, as in
// `kinesis_subscriptions_shards.rs`; the stream is created when missing.
//
// No `//!` docs or `#![..]` attributes here: `tests/example_publish_keys.rs` includes this
// file with `include!`, where inner attributes are not allowed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kinesis_dataflow::broker::prelude::*;
use kinesis_dataflow::broker::{ConnectedKinesis, PARTITION_KEY_HEADER};
use ruststream::codec::{Codec, JsonCodec};
use ruststream::{ConnectedBroker, OutgoingMessage};
use serde::{Deserialize, Serialize};

/// The stream the notes are published to.
pub const NOTES: &str = "notes";
/// The key fixed on the audit publisher's policy ([`Way::Policy`]).
pub const AUDIT_KEY: &str = "audit";

/// How a note names its partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Way {
    /// 1. Per publish, in the options: `KinesisOptions::partition_key(series)`.
    Options,
    /// 1. Per publish, through the publish builder's `.partition_key(series)` step.
    Step,
    /// 2. The series rides in the `partition-key` header.
    Header,
    /// 3. Through a publisher whose policy fixes the key ([`AUDIT_KEY`]).
    Policy,
    /// 4. No key named anywhere: a random one per record.
    Random,
}

impl Way {
    /// Every way, in the order the docs list them.
    pub const ALL: [Way; 5] = [
        Way::Options,
        Way::Step,
        Way::Header,
        Way::Policy,
        Way::Random,
    ];

    /// The way's name, as it is logged and serialized.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Way::Options => "options",
            Way::Step => "step",
            Way::Header => "header",
            Way::Policy => "policy",
            Way::Random => "random",
        }
    }
}

/// One note of a series, published the way it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Outgoing)]
#[outgoing(name = "notes")]
pub struct Note {
    /// How its partition key is named.
    pub way: Way,
    /// The series it belongs to: the key, for [`Way::Options`], [`Way::Step`] and
    /// [`Way::Header`].
    pub series: String,
    /// Its place in the series, from 1.
    pub seq: u64,
}

/// How many notes `show` has handled in this process.
static SHOWN: AtomicUsize = AtomicUsize::new(0);

/// Logs each note (`note`, with its way, series and seq) with the partition key its record
/// carries and the shard it is on.
#[subscriber(
    KinesisStream::new(NOTES)
        .create_if_missing(4)
        .poll_interval(Duration::from_millis(100))
)]
async fn show(
    note: &Note,
    Ctx(partition_key): Ctx<PartitionKey>,
    Ctx(shard): Ctx<ShardId>,
) -> HandlerOutcome {
    tracing::info!(
        way = note.way.as_str(),
        series = %note.series,
        seq = note.seq,
        partition_key = %partition_key,
        shard = %shard,
        "note"
    );
    SHOWN.fetch_add(1, Ordering::Relaxed);
    HandlerOutcome::ack()
}

/// The app: `show` on the [`NOTES`] stream (four shards when it has to be created).
pub fn service(broker: KinesisBroker) -> RustStream {
    RustStream::new(AppInfo::new("publish-keys", "0.1.0")).with_broker(broker, |b| {
        b.include(show);
    })
}

/// Why [`publish_notes`] stopped.
pub type PublishFailed = Box<dyn std::error::Error + Send + Sync>;

/// Publishes `notes` to [`NOTES`] in order, each with its partition key named the way the
/// note says, through `producer`.
///
/// # Errors
///
/// The first publish that failed (or a note that did not encode).
pub async fn publish_notes(
    producer: &ConnectedKinesis,
    notes: &[Note],
) -> Result<(), PublishFailed> {
    // The default policy names no key: each publish names its own, or gets a random one.
    let publisher = producer.publisher();
    // 3. A publisher whose policy fixes the key of every publish that names none.
    let audit = KinesisPublish::default()
        .partition_key(AUDIT_KEY)
        .pair(producer)
        .await?;
    for note in notes {
        match note.way {
            // 1. The key in the publish's options.
            Way::Options => {
                let body = JsonCodec.encode(note)?;
                publisher
                    .publish(
                        OutgoingMessage::new(NOTES, &body[..]),
                        Some(&KinesisOptions::partition_key(note.series.clone())),
                    )
                    .await?;
            }
            // 1. The same, through the publish builder's step.
            Way::Step => {
                publisher
                    .message(note)
                    .partition_key(note.series.clone())
                    .publish()
                    .await?;
            }
            // 2. The key in the `partition-key` header.
            Way::Header => {
                let mut headers = HeaderMap::new();
                headers.insert(PARTITION_KEY_HEADER, note.series.clone());
                publisher
                    .message(note)
                    .with_headers(headers)
                    .publish()
                    .await?;
            }
            // 3. The policy's key.
            Way::Policy => audit.message(note).publish().await?,
            // 4. Nothing named: a random key.
            Way::Random => publisher.message(note).publish().await?,
        }
    }
    Ok(())
}

/// The notes `main` publishes: three of two series each way, interleaved.
#[must_use]
pub fn demo_notes() -> Vec<Note> {
    let series = ["ada", "bob"];
    (1..=3)
        .flat_map(|seq| {
            Way::ALL.into_iter().flat_map(move |way| {
                series.into_iter().map(move |name| Note {
                    way,
                    series: format!("{}-{name}", way.as_str()),
                    seq,
                })
            })
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), PublishFailed> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let broker = if std::env::args().any(|a| a == "--aws") {
        KinesisBroker::new()
    } else {
        // The app and the producer share one in-memory Kinesis (clones of the broker do).
        KinesisBroker::in_memory(MemoryKinesis::new())
    };
    let running = service(broker.clone()).start().await?;
    let producer = broker.connect().await?;
    let notes = demo_notes();
    publish_notes(&producer, &notes).await?;

    // Wait until every note was shown (at most 30 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while SHOWN.load(Ordering::Relaxed) < notes.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{} of {} notes shown",
        SHOWN.load(Ordering::Relaxed),
        notes.len()
    );
    running.shutdown().await?;
    producer.shutdown().await?;
    Ok(())
}
