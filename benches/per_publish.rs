//! Per-record cost of publishing on the in-memory transport: allocations per record (counted
//! by a global allocator) and, under callgrind, instructions per record, for three ways of
//! publishing the same 100-byte records under 1,000 keys to a 4-shard stream, on one thread:
//!
//! * `batch`: `publish_batch` of 500 records from one task (the baseline: the send path
//!   alone, a call's worth at a time);
//! * `collected`: 64 tasks each awaiting `publish` of one record after another, with the
//!   default publisher, which collects them into shared calls;
//! * `direct`: the same 64 tasks with `without_collect`: one PutRecords call per record.
//!
//! ```text
//! cargo bench --bench per_publish                                      # allocations, all three
//! cargo bench --bench per_publish -- --mode collected --records 20000  # one mode (for callgrind)
//! MODES="batch collected direct" BENCH=per_publish benches/callgrind.sh # instructions per record
//! ```
//!
//! The in-memory transport's own work (routing each record by the MD5 of its key, storing it)
//! is in every mode, so the differences between modes are the publisher's.

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kinesis_dataflow::{MemoryKinesis, OutgoingRecord, Publisher};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::runtime::Runtime;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const STREAM: &str = "bench";
const TASKS: usize = 64;
const BATCH: usize = 500;

fn key(i: usize) -> String {
    format!("key-{}", i % 1_000)
}

fn payload() -> bytes::Bytes {
    bytes::Bytes::from(vec![b'x'; 100])
}

/// Publishes `records` records one way; returns the allocations made while publishing.
fn publish(runtime: &Runtime, mode: &str, records: usize) -> u64 {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 4).expect("creates the stream");
    let publisher = Publisher::new(Arc::new(memory.clone()), STREAM);
    let region = Region::new(GLOBAL);
    match mode {
        "batch" => measured_batch(runtime, publisher.without_collect(), records),
        "collected" => measured_tasks(runtime, publisher, records),
        "direct" => measured_tasks(runtime, publisher.without_collect(), records),
        other => panic!("unknown mode {other:?}: batch, collected or direct"),
    }
    let allocations = region.change().allocations as u64;
    let stored: usize = (0..4)
        .map(|s| {
            memory
                .records(STREAM, &format!("shardId-{s:012}"))
                .map_or(0, |r| r.len())
        })
        .sum();
    assert_eq!(stored, records, "{mode}: every record stored");
    allocations
}

fn measured_batch(runtime: &Runtime, publisher: Publisher, records: usize) {
    runtime.block_on(async {
        let payload = payload();
        for first in (0..records).step_by(BATCH) {
            let batch = (first..records.min(first + BATCH))
                .map(|i| OutgoingRecord::new(key(i), payload.clone()))
                .collect();
            publisher.publish_batch(batch).await.expect("stored");
        }
    });
}

fn measured_tasks(runtime: &Runtime, publisher: Publisher, records: usize) {
    runtime.block_on(async {
        let next = Arc::new(AtomicUsize::new(0));
        let payload = payload();
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (publisher, next, payload) = (publisher.clone(), next.clone(), payload.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= records {
                            return;
                        }
                        publisher
                            .publish(key(i), payload.clone())
                            .await
                            .expect("stored");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("the task ends");
        }
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
    let records: usize = value("--records").map_or(20_000, |n| n.parse().expect("a number"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Some(mode) = value("--mode") {
        let allocations = publish(&runtime, &mode, records);
        println!("{mode}: {records} records, {allocations} allocations");
        return;
    }
    println!(
        "allocations per record ({records} and {} records):",
        2 * records
    );
    for mode in ["batch", "collected", "direct"] {
        let once = publish(&runtime, mode, records);
        let twice = publish(&runtime, mode, 2 * records);
        let per_record = (twice - once) as f64 / records as f64;
        println!("  {mode:<10} {per_record:.3}");
    }
}
