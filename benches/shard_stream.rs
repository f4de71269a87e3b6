//! Records per second through one shard stream on the in-memory transport (read-rate cap
//! lifted, 10,000 records a read), against a bare `futures::stream::iter` over the same
//! records as the baseline. Compare the two throughputs as a ratio; absolute figures depend on
//! the machine.
//!
//! ```text
//! cargo bench --bench shard_stream
//! ```

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::{MemoryKinesis, ReadSettings, Record, ShardStream, StartingPoint};

const RECORDS: usize = 100_000;
const STREAM: &str = "bench";
const SHARD: &str = "shardId-000000000000";

fn setup() -> (SharedKinesis, Vec<Record>) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let payload = vec![b'x'; 100];
    for i in 0..RECORDS {
        memory
            .put(STREAM, &format!("key-{}", i % 64), payload.clone())
            .unwrap();
    }
    let api: SharedKinesis = Arc::new(memory);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let records = runtime.block_on(async {
        let mut it = api
            .get_shard_iterator(STREAM, SHARD, &StartingPoint::TrimHorizon)
            .await
            .unwrap();
        let mut all = Vec::with_capacity(RECORDS);
        while all.len() < RECORDS {
            let out = api
                .get_records(STREAM, &Arc::from(SHARD), it, 10_000)
                .await
                .unwrap();
            all.extend(out.records);
            it = out.next_shard_iterator.unwrap();
        }
        all
    });
    (api, records)
}

fn bench(c: &mut Criterion) {
    let (api, records) = setup();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("shard_stream");
    group.throughput(Throughput::Elements(RECORDS as u64));
    group.sample_size(20);

    group.bench_function("baseline_stream_iter", |b| {
        b.iter_batched(
            || records.clone(),
            |records| {
                runtime.block_on(async {
                    let mut s = futures::stream::iter(records.into_iter().map(Ok::<_, ()>));
                    let mut n = 0usize;
                    while let Some(r) = s.next().await {
                        n += black_box(r.unwrap()).data().len();
                    }
                    n
                })
            },
            BatchSize::LargeInput,
        );
    });

    group.bench_function("shard_stream_memory", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut s = ShardStream::builder(api.clone(), STREAM, SHARD)
                    .settings(ReadSettings::default().unlimited_reads().batch_size(10_000))
                    .open(StartingPoint::TrimHorizon)
                    .unwrap();
                let mut n = 0usize;
                for _ in 0..RECORDS {
                    n += black_box(s.next().await.unwrap().unwrap()).data().len();
                }
                n
            })
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
