//! Fault injection, latency, the call log, and sharing one store.

use super::*;

#[tokio::test]
async fn faults_are_consumed_one_per_call_in_injection_order() {
    let k = kinesis("s", 2);
    let shard: Arc<str> = S0.into();
    let it = iterator(&k, "s", S0, StartingPoint::Latest).await;
    k.inject(Fault::throttle(Operation::GetRecords).times(2));
    k.inject(Fault::fail(Operation::GetRecords, "boom"));
    k.inject(Fault::expire_iterator());
    assert_eq!(k.pending_faults().len(), 3);

    let e = err(k.get_records("s", &shard, it.clone(), 10).await);
    assert!(e.is_throttle());
    assert!(err(k.get_records("s", &shard, it.clone(), 10).await).is_throttle());
    match err(k.get_records("s", &shard, it.clone(), 10).await) {
        KinesisError::Service {
            message, stream, ..
        } => {
            assert_eq!(message, "boom");
            assert_eq!(stream, "s");
        }
        other => panic!("{other:?}"),
    }
    assert!(err(k.get_records("s", &shard, it.clone(), 10).await).is_expired_iterator());
    assert!(k.get_records("s", &shard, it.clone(), 10).await.is_ok());
    assert!(k.pending_faults().is_empty());
    assert_eq!(
        k.call_count(Operation::GetRecords),
        5,
        "faulted calls are logged"
    );

    // Shard faults hit only their shard; other operations are untouched.
    k.inject(Fault::throttle(Operation::GetRecords).on_shard(S1));
    assert!(k.get_records("s", &shard, it.clone(), 10).await.is_ok());
    assert!(k.list_shards("s", None).await.is_ok());
    let it1 = iterator(&k, "s", S1, StartingPoint::Latest).await;
    let s1: Arc<str> = S1.into();
    assert!(err(k.get_records("s", &s1, it1.clone(), 10).await).is_throttle());
    assert!(k.get_records("s", &s1, it1, 10).await.is_ok());

    // Any operation can be faulted; a fault of zero times never fires; faults can be cleared.
    k.inject(Fault::throttle(Operation::ListShards).times(0));
    k.inject(Fault::new(
        Operation::DescribeStreamSummary,
        FaultKind::Fail("down".into()),
    ));
    assert!(k.list_shards("s", None).await.is_ok());
    assert!(matches!(
        err(k.describe_stream_summary("s").await),
        KinesisError::Service {
            operation: Operation::DescribeStreamSummary,
            ..
        }
    ));
    k.inject(Fault::throttle(Operation::CreateStream).times(u32::MAX));
    assert!(err(k.create_stream("x", 1).await).is_throttle());
    k.clear_faults();
    assert!(k.create_stream("x", 1).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn latency_delays_answers() {
    let k = kinesis("s", 1);
    k.set_latency(Duration::from_millis(100));
    k.inject(Fault::latency(
        Operation::DescribeStreamSummary,
        Duration::from_secs(1),
    ));
    let started = tokio::time::Instant::now();
    let summary = k.describe_stream_summary("s").await.expect("summary");
    assert_eq!(summary.status, StreamStatus::Active);
    assert_eq!(started.elapsed(), Duration::from_millis(1100));

    let started = tokio::time::Instant::now();
    k.list_shards("s", None).await.expect("list");
    assert_eq!(started.elapsed(), Duration::from_millis(100));

    k.set_latency(Duration::ZERO);
    let started = tokio::time::Instant::now();
    k.list_shards("s", None).await.expect("list");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn put_records_fail_entry_by_entry_on_a_throttled_shard() {
    let k = kinesis("s", 2);
    k.inject(Fault::throttle(Operation::PutRecords).on_shard(S0));
    let out = k
        .put_records("s", vec![entry_at(0, b"a"), entry_at(u128::MAX, b"b")])
        .await
        .expect("put");
    assert_eq!(out.failed_count(), 1);
    match &out.results[0] {
        PutRecordResult::Failed { code, message } => {
            assert_eq!(code, "ProvisionedThroughputExceededException");
            assert!(message.contains(S0));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(&out.results[1], PutRecordResult::Stored { shard_id, .. } if shard_id == S1));
    assert!(k.records("s", S0).expect("records").is_empty());

    // A shard fault waits for a call that routes to its shard.
    k.inject(Fault::fail(Operation::PutRecords, "disk").on_shard(S0));
    let out = k
        .put_records("s", vec![entry_at(u128::MAX, b"c")])
        .await
        .expect("put");
    assert_eq!(out.failed_count(), 0);
    let out = k
        .put_records("s", vec![entry_at(0, b"d")])
        .await
        .expect("put");
    assert!(matches!(
        &out.results[0],
        PutRecordResult::Failed { code, message } if code == "InternalFailure" && message == "disk"
    ));

    // Without a shard the whole call is throttled and nothing is stored.
    k.inject(Fault::throttle(Operation::PutRecords));
    assert!(err(k.put_records("s", vec![entry_at(0, b"e")]).await).is_throttle());
    assert!(k.records("s", S0).expect("records").is_empty());
    let out = k
        .put_records("s", vec![entry_at(0, b"f")])
        .await
        .expect("put");
    assert_eq!(out.failed_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn every_call_is_logged() {
    let k = kinesis("s", 1);
    let shard: Arc<str> = S0.into();
    let it = iterator(&k, "s", S0, StartingPoint::TrimHorizon).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    k.get_records("s", &shard, it.clone(), 7)
        .await
        .expect("read");
    let _ = k.describe_stream_summary("missing").await;
    k.merge_shards("s", S0, S0).await.expect_err("refused");

    let calls = k.calls();
    assert_eq!(calls.len(), 4);
    assert_eq!(calls[0].operation, Operation::GetShardIterator);
    assert_eq!(calls[0].shard.as_deref(), Some(S0));
    assert_eq!(calls[0].starting_point, Some(StartingPoint::TrimHorizon));
    assert_eq!(calls[1].operation, Operation::GetRecords);
    assert_eq!(calls[1].limit, Some(7));
    assert_eq!(calls[1].iterator.as_deref(), Some(it.as_str()));
    assert_eq!(calls[0].iterator, None);
    assert_eq!(calls[1].at - calls[0].at, Duration::from_secs(1));
    assert_eq!(calls[2].stream, "missing");
    assert_eq!(calls[3].operation, Operation::MergeShards);
    assert_eq!(k.call_count(Operation::GetRecords), 1);
    assert_eq!(k.call_count(Operation::PutRecords), 0);

    // The sync helpers are not logged.
    k.put("s", "k", "x").expect("put");
    assert_eq!(k.calls().len(), 4);
    k.clear_calls();
    assert!(k.calls().is_empty());
    assert_eq!(k.call_count(Operation::GetRecords), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_one_store_across_tasks() {
    let k = kinesis("s", 4);
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let k = k.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    let entries = vec![entry(&format!("w{w}-{i}"), b"x")];
                    k.put_records("s", entries).await.expect("put");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }
    let mut total = 0;
    for shard in [S0, S1, S2, S3] {
        let (records, _) = read_all(&k, "s", shard, StartingPoint::TrimHorizon, 1000).await;
        total += records.len();
    }
    assert_eq!(total, 200);
    assert_eq!(k.call_count(Operation::PutRecords), 200);
    let debug = format!("{k:?}");
    assert!(
        debug.contains("MemoryKinesis") && debug.contains("memory"),
        "{debug}"
    );
    let shared: crate::api::SharedKinesis = Arc::new(k);
    assert_eq!(shared.region(), "memory");
}
