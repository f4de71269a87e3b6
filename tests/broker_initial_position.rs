//! `KinesisStream::initial_position` (the KCL's initial position) against `start_at` (the
//! spec's), on the broker face against kinesis-local and dynalite: both read the backlog at an
//! application's first start; at the next start, `initial_position` resumes from the
//! checkpoints (nothing handled twice) while `start_at` replays.

mod support;

use std::future::{Future, ready};
use std::time::Duration;

use kinesis_dataflow::broker::prelude::*;
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};

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

fn app(application: &str, source: KinesisStream) -> RustStream {
    RustStream::new(AppInfo::new("initial-position", "0.1.0")).with_broker(
        support::live_broker(application),
        |b| {
            b.include(subscriber(source, Record).build());
        },
    )
}

async fn publish(application: &str, stream: &str, tag: &str, n: usize) {
    let producer = support::live_broker(application).connect().await.unwrap();
    let publisher = producer.publisher();
    for i in 0..n {
        publisher
            .publish(
                OutgoingMessage::new(stream, format!("{tag}-{i}").as_bytes()),
                Some(&KinesisOptions::partition_key(format!("key-{i}"))),
            )
            .await
            .unwrap();
    }
    producer.shutdown().await.unwrap();
}

/// Runs the app until `count` records of `stream` were handled in all, then stops it (the
/// checkpoints are flushed).
async fn run_until(application: &str, source: KinesisStream, stream: &str, count: usize) {
    let running = app(application, source).start().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handled(stream).len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {count} handled: {:?}",
            handled(stream).len(),
            handled(stream)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Long enough for a replay to show up, were there one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    running.shutdown().await.unwrap();
}

fn source(stream: &str) -> KinesisStream {
    KinesisStream::new(stream)
        .create_if_missing(2)
        .poll_interval(Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_position_reads_the_backlog_once_and_start_at_replays_it() {
    support::events::record_events();
    for replay in [false, true] {
        let application = support::unique_name("initial");
        let stream = support::unique_name("initial-stream");
        let with_position = |s: KinesisStream| {
            if replay {
                s.start_at(KinesisPosition::horizon())
            } else {
                s.initial_position(KinesisPosition::horizon())
            }
        };
        // The stream exists with a backlog before the application's first start.
        support::create_stream(&support::kinesis_client(), &stream, 2).await;
        publish(&application, &stream, "old", 6).await;
        run_until(&application, with_position(source(&stream)), &stream, 6).await;

        publish(&application, &stream, "new", 4).await;
        let expected = if replay { 6 + 6 + 4 } else { 6 + 4 };
        run_until(
            &application,
            with_position(source(&stream)),
            &stream,
            expected,
        )
        .await;
        let got = handled(&stream);
        assert_eq!(
            got.len(),
            expected,
            "replay {replay}: what the second start handled: {got:?}"
        );
    }
}
