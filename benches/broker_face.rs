//! The whole broker-face path (framework dispatch + our broker) on the in-memory transport,
//! against the framework's own in-memory broker (`ruststream::memory::MemoryBroker`) as the
//! baseline, in the same run: a RustStream app with one trivial handler (decode a small JSON
//! body, count it), fed `RECORDS` messages, timed from the first publish until the handler
//! counted the last. Three figures per round, each with allocations per record:
//!
//! * `memory`: MemoryBroker, published through its own publisher (the baseline);
//! * `kinesis publish+consume`: KinesisBroker on `MemoryKinesis`, published through its
//!   publisher (one PutRecords per message, as the framework hands them over one by one);
//! * `kinesis consume`: KinesisBroker, the records written to the in-memory Kinesis before
//!   the app starts at TRIM_HORIZON, so only reading and dispatch are timed.
//!
//! The figures to quote are the ratios to the baseline of the same round (the medians of
//! `ROUNDS` rounds); absolute rates depend on the machine.
//!
//! ```text
//! cargo bench --bench broker_face            # 5 rounds of 20,000 records
//! cargo bench --bench broker_face -- --quick # 1 round of 2,000 (a smoke run)
//! ```

use std::alloc::System;
use std::future::{Future, ready};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, ReadSettings};
use ruststream::memory::{MemoryBroker, MemorySource};
use ruststream::runtime::{AppInfo, Context, Handle, HandlerOutcome, RustStream, subscriber};
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use serde::Deserialize;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const STREAM: &str = "bench";
const PAYLOAD: &[u8] =
    br#"{"n":7,"customer":"ada","note":"a small shipment record of about 100 bytes of json"}"#;

static HANDLED: AtomicUsize = AtomicUsize::new(0);

#[derive(Deserialize)]
struct Tick {
    n: u64,
}

/// The trivial handler: counts what it decoded.
struct Count;

impl Handle<Tick> for Count {
    fn handle(
        &self,
        tick: &Tick,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        black_box(tick.n);
        HANDLED.fetch_add(1, Ordering::Relaxed);
        ready(Ok(()))
    }
}

/// One measurement: wall time and allocations per record.
#[derive(Clone, Copy)]
struct Figure {
    elapsed: Duration,
    allocations: f64,
}

async fn handled(records: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while HANDLED.load(Ordering::Relaxed) < records {
        assert!(Instant::now() < deadline, "the handler stalled");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

fn kinesis_source() -> KinesisStream {
    KinesisStream::new(STREAM).read_settings(
        ReadSettings::default()
            .batch_size(10_000)
            .unlimited_reads()
            .poll_interval(Duration::from_millis(1)),
    )
}

/// Times `records` publishes (one at a time) until the handler counted them all.
async fn published(records: usize, mut publish_one: impl AsyncFnMut()) -> Figure {
    let region = Region::new(GLOBAL);
    let started = Instant::now();
    for _ in 0..records {
        publish_one().await;
    }
    handled(records).await;
    figure(started, &region, records)
}

async fn memory_round(records: usize) -> Figure {
    HANDLED.store(0, Ordering::Relaxed);
    let broker = MemoryBroker::new();
    let app = RustStream::new(AppInfo::new("bench", "0.1.0")).with_broker(broker.clone(), |b| {
        b.include(subscriber(MemorySource::new(STREAM), Count).build());
    });
    let running = app.start().await.expect("the app starts");
    let producer = broker.connect().await.expect("connects");
    let publisher = producer.publisher();
    let figure = published(records, async || {
        publisher
            .publish(OutgoingMessage::new(STREAM, PAYLOAD), None)
            .await
            .expect("publishes");
    })
    .await;
    let _ = producer.shutdown().await;
    let _ = running.shutdown().await;
    figure
}

async fn kinesis_round(records: usize) -> Figure {
    HANDLED.store(0, Ordering::Relaxed);
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream(STREAM, 1).expect("creates the stream");
    let broker = KinesisBroker::in_memory(kinesis);
    let app = RustStream::new(AppInfo::new("bench", "0.1.0")).with_broker(broker.clone(), |b| {
        b.include(subscriber(kinesis_source(), Count).build());
    });
    let running = app.start().await.expect("the app starts");
    let producer = broker.connect().await.expect("connects");
    let publisher = producer.publisher();
    let figure = published(records, async || {
        publisher
            .publish(OutgoingMessage::new(STREAM, PAYLOAD), None)
            .await
            .expect("publishes");
    })
    .await;
    let _ = producer.shutdown().await;
    let _ = running.shutdown().await;
    figure
}

async fn kinesis_consume_round(records: usize) -> Figure {
    HANDLED.store(0, Ordering::Relaxed);
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream(STREAM, 1).expect("creates the stream");
    for i in 0..records {
        kinesis
            .put(STREAM, &format!("key-{}", i % 64), PAYLOAD)
            .expect("writes");
    }
    let broker = KinesisBroker::in_memory(kinesis);
    let app = RustStream::new(AppInfo::new("bench", "0.1.0")).with_broker(broker, |b| {
        let source = kinesis_source().start_at(KinesisPosition::horizon());
        b.include(subscriber(source, Count).build());
    });
    let region = Region::new(GLOBAL);
    let started = Instant::now();
    let running = app.start().await.expect("the app starts");
    handled(records).await;
    let figure = figure(started, &region, records);
    let _ = running.shutdown().await;
    figure
}

fn figure(started: Instant, region: &Region<'_, System>, records: usize) -> Figure {
    let elapsed = started.elapsed();
    let stats = region.change();
    Figure {
        elapsed,
        allocations: stats.allocations as f64 / records as f64,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (records, rounds) = if quick { (2_000, 1) } else { (20_000, 5) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    println!("broker face: {records} records a round, {rounds} round(s)");
    let mut ratios = Vec::new();
    let mut consume_ratios = Vec::new();
    for round in 1..=rounds {
        let (memory, kinesis, consume) = runtime.block_on(async {
            (
                memory_round(records).await,
                kinesis_round(records).await,
                kinesis_consume_round(records).await,
            )
        });
        let rate = |f: Figure| records as f64 / f.elapsed.as_secs_f64();
        let ratio = rate(kinesis) / rate(memory);
        let consume_ratio = rate(consume) / rate(memory);
        println!(
            "round {round}: memory {:>9.0}/s ({:.1} allocs/record) | kinesis publish+consume \
             {:>9.0}/s ({:.1} allocs/record), {ratio:.3} of memory | kinesis consume {:>9.0}/s \
             ({:.1} allocs/record), {consume_ratio:.3} of memory",
            rate(memory),
            memory.allocations,
            rate(kinesis),
            kinesis.allocations,
            rate(consume),
            consume.allocations,
        );
        ratios.push(ratio);
        consume_ratios.push(consume_ratio);
    }
    println!(
        "median: kinesis publish+consume {:.3} of the framework's in-memory broker; kinesis \
         consume {:.3}",
        median(ratios),
        median(consume_ratios)
    );
}
