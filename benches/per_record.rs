//! Per-record cost of the core on the in-memory transport: allocations per record (counted by a
//! global allocator) and, under callgrind, instructions per record, for several consumers of the
//! same records:
//!
//! * `iter`: a bare `futures::stream::iter` over the records, already built (the baseline);
//! * `shard`: one `ShardStream` reading them from a `MemoryKinesis` (GetRecords of 10,000,
//!   read-rate cap lifted, no background tasks so the count is the reader's alone);
//! * `subscription`: a `Subscription` (in-memory leases) over the same shard, every delivery
//!   acked through the `AckSink`;
//! * `durable`: the same with `AckSink::durable_flush(true)`, so every flush `forward` makes
//!   waits for a written checkpoint (the cost of a durable flush; the checkpoint writes are
//!   printed);
//! * `deadline`: `subscription` with a settlement deadline per delivery (`settle_within`), which
//!   keeps a clone of each record handed out and a deadline queue;
//! * `deaggregated`: `subscription` with de-aggregation on, over the same number of user records
//!   packed 100 to a KPL aggregate (so the figures are per user record);
//! * `four`: `subscription` over four shards, a quarter of the records each (the end-to-end
//!   drain's shape);
//! * `wide`: `subscription` over 64 shards, every record in one of them (a busy shard among
//!   idle ones, which cost per record what the merge spends on them);
//! * `multi`: a `MultiSubscription` over 20 streams of one shard each, every record in one of
//!   them (a busy stream among idle ones).
//!
//! ```text
//! cargo bench --bench per_record                      # allocations per record, all modes
//! cargo bench --bench per_record -- --mode shard --records 20000   # one mode (for callgrind)
//! benches/callgrind.sh                                # instructions per record, all six
//! ```
//!
//! `--metrics` installs a Prometheus recorder (`metrics-exporter-prometheus`) first, so every
//! metric update is recorded; without it the handles are no-ops, and built with
//! `--no-default-features --features broker` the metrics are compiled out (the three figures
//! of BENCHMARKS.md's "Metrics on the per-record path").
//!
//! Instructions per record come from two callgrind runs of one mode, with N and 2N records:
//! (I(2N) - I(N)) / N, so the setup (building the stream, the runtime) cancels out.

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::{
    AckSink, Delivery, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore,
    MultiSubscription, ReadSettings, Record, ShardStream, StartingPoint, StreamSet, Subscription,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::runtime::Runtime;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const STREAM: &str = "bench";
const SHARD: &str = "shardId-000000000000";

fn kinesis(records: usize) -> MemoryKinesis {
    kinesis_sharded(records, 1, 64)
}

/// `records` records of 100 bytes over `shards` shards, written with `keys` partition keys
/// (one key: every record in one shard).
fn kinesis_sharded(records: usize, shards: u32, keys: usize) -> MemoryKinesis {
    let memory = MemoryKinesis::new();
    memory
        .add_stream(STREAM, shards)
        .expect("creates the stream");
    let payload = vec![b'x'; 100];
    for i in 0..records {
        memory
            .put(STREAM, &format!("key-{}", i % keys), payload.clone())
            .expect("writes");
    }
    memory
}

/// `records` user records of 100 bytes, 100 to an aggregate.
fn kinesis_aggregated(records: usize) -> MemoryKinesis {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).expect("creates the stream");
    let payload = vec![b'x'; 100];
    let keys: Vec<String> = (0..64).map(|i| format!("key-{i}")).collect();
    for first in (0..records).step_by(100) {
        let users = (first..records.min(first + 100))
            .map(|i| (keys[i % 64].as_str(), None, payload.as_slice()));
        memory
            .put(STREAM, "aggregate", kinesis_dataflow::kpl::aggregate(users))
            .expect("writes");
    }
    memory
}

fn settings() -> ReadSettings {
    ReadSettings::default()
        .batch_size(10_000)
        .unlimited_reads()
        .poll_interval(Duration::from_millis(1))
        .background_reads(false)
}

/// Consumes `records` records one way; returns the allocations made while consuming. The
/// consuming itself runs in the `measured_*` functions, which `benches/callgrind.sh` tells
/// callgrind to count (`--toggle-collect`), so building the stream is left out.
fn consume(runtime: &Runtime, mode: &str, records: usize) -> u64 {
    let memory = match mode {
        "deaggregated" => kinesis_aggregated(records),
        // The drain's shape: four shards, each with a quarter of the records.
        "four" => kinesis_sharded(records, 4, 64),
        // One busy shard among 63 idle ones.
        "wide" => kinesis_sharded(records, 64, 1),
        _ => kinesis(records),
    };
    match mode {
        "iter" => {
            let built: Vec<Record> = memory.records(STREAM, SHARD).expect("the shard's records");
            let region = Region::new(GLOBAL);
            measured_iter(runtime, built, records);
            region.change().allocations as u64
        }
        "shard" => {
            let api: SharedKinesis = Arc::new(memory);
            let region = Region::new(GLOBAL);
            measured_shard(runtime, api, records);
            region.change().allocations as u64
        }
        "subscription" | "durable" | "deadline" | "deaggregated" | "four" | "wide" => {
            let api: SharedKinesis = Arc::new(memory);
            let leases = MemoryLeaseStore::new();
            let subscription = runtime.block_on(async {
                let builder = Subscription::builder(api, Arc::new(leases.clone()), STREAM)
                    .start_at(KinesisPosition::horizon())
                    .read_settings(settings().deaggregate(mode == "deaggregated"));
                // Idle shards read once and then wait, rather than read empty every
                // millisecond of the (slow, instrumented) run.
                let builder = if mode == "wide" {
                    builder.read_settings(settings().poll_interval(Duration::from_secs(600)))
                } else {
                    builder
                };
                let builder = if mode == "deadline" {
                    builder.settle_within(Duration::from_secs(600))
                } else {
                    builder
                };
                builder.start().await.expect("starts")
            });
            let stop = subscription.shutdown_handle();
            let region = Region::new(GLOBAL);
            measured_subscription(runtime, subscription, records, mode == "durable");
            let allocations = region.change().allocations as u64;
            runtime.block_on(stop.shutdown());
            eprintln!(
                "{mode}: {} checkpoint writes",
                leases.checkpoint_writes(STREAM, SHARD)
            );
            allocations
        }
        "multi" => {
            let mut names = vec![STREAM.to_owned()];
            for i in 1..20 {
                let name = format!("idle-{i:02}");
                memory.add_stream(&name, 1).expect("creates the stream");
                names.push(name);
            }
            let api: SharedKinesis = Arc::new(memory);
            let leases = MemoryLeaseStore::new();
            let subscription = runtime.block_on(async {
                MultiSubscription::builder(api, Arc::new(leases.clone()), StreamSet::new(names))
                    .configure(|each| {
                        each.start_at(KinesisPosition::horizon())
                            .read_settings(settings().poll_interval(Duration::from_secs(600)))
                    })
                    .start()
                    .await
                    .expect("starts")
            });
            let stop = subscription.shutdown_handle();
            let region = Region::new(GLOBAL);
            measured_subscription(runtime, subscription, records, false);
            let allocations = region.change().allocations as u64;
            runtime.block_on(stop.shutdown());
            allocations
        }
        other => panic!(
            "unknown mode {other:?}: iter, shard, subscription, durable, deadline, deaggregated, \
             four, wide or multi"
        ),
    }
}

#[inline(never)]
fn measured_iter(runtime: &Runtime, built: Vec<Record>, records: usize) {
    runtime.block_on(async {
        let n = stream::iter(built)
            .map(|r| black_box(r.data().len()))
            .count()
            .await;
        assert_eq!(n, records);
    });
}

#[inline(never)]
fn measured_shard(runtime: &Runtime, api: SharedKinesis, records: usize) {
    runtime.block_on(async {
        let mut shard = ShardStream::builder(api, STREAM, SHARD)
            .settings(settings())
            .open(StartingPoint::TrimHorizon)
            .expect("opens");
        let mut n = 0;
        while n < records {
            let record = shard.next().await.expect("open shard").expect("read");
            black_box(record.data().len());
            n += 1;
        }
    });
}

#[inline(never)]
fn measured_subscription(
    runtime: &Runtime,
    subscription: impl futures::Stream<Item = Result<Delivery<Record>, KinesisError>> + Unpin,
    records: usize,
    durable_flush: bool,
) {
    runtime.block_on(async {
        subscription
            .filter_map(|item| futures::future::ready(item.ok()))
            .take(records)
            .map(Ok)
            .forward(AckSink::new().durable_flush(durable_flush))
            .await
            .expect("the last checkpoint is written");
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let records: usize = value("--records").map_or(20_000, |n| n.parse().expect("a count"));
    if args.iter().any(|a| a == "--metrics") {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("the recorder is installed");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Some(mode) = value("--mode") {
        let allocations = consume(&runtime, &mode, records);
        println!("{mode}: {records} records, {allocations} allocations");
        return;
    }
    // Allocations per record: the difference between 2N and N records, so fixed costs cancel.
    println!(
        "allocations per record (from runs of {records} and {} records):",
        2 * records
    );
    for mode in [
        "iter",
        "shard",
        "subscription",
        "durable",
        "deadline",
        "deaggregated",
        "four",
        "wide",
        "multi",
    ] {
        let once = consume(&runtime, mode, records);
        let twice = consume(&runtime, mode, 2 * records);
        let per_record = (twice as f64 - once as f64) / records as f64;
        println!("  {mode:<13} {per_record:.3}");
    }
}
