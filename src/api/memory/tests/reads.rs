//! Iterators of every type, reads, expiry and the trim horizon.

use super::*;

#[tokio::test]
async fn trim_horizon_and_latest() {
    let k = kinesis("s", 1);
    for data in ["a", "b", "c"] {
        k.put("s", "k", data).expect("put");
    }
    let latest = iterator(&k, "s", S0, StartingPoint::Latest).await;
    let (records, last) = read_all(&k, "s", S0, StartingPoint::TrimHorizon, 2).await;
    assert_eq!(datas(&records), vec![b"a", b"b", b"c"]);
    assert!(records.iter().all(|r| r.shard_id() == S0));
    assert!(
        last.next_shard_iterator.is_some(),
        "an open shard never ends"
    );
    assert!(last.child_shards.is_empty());

    let shard: Arc<str> = S0.into();
    let page = k
        .get_records("s", &shard, latest.clone(), 10)
        .await
        .expect("read");
    assert!(page.records.is_empty());
    assert_eq!(page.millis_behind_latest, Some(0));
    k.put("s", "k", "d").expect("put");
    let page = k.get_records("s", &shard, latest, 10).await.expect("read");
    assert_eq!(datas(&page.records), vec![b"d"]);
    // The record is tagged with the very shard handle given.
    assert!(Arc::ptr_eq(page.records[0].shard_id_shared(), &shard));
}

#[tokio::test]
async fn at_and_after_sequence_number() {
    let k = kinesis("s", 1);
    let seqs: Vec<String> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|d| k.put("s", "k", d).expect("put").1)
        .collect();
    let (at, _) = read_all(&k, "s", S0, StartingPoint::AtSequence(seqs[1].clone()), 10).await;
    assert_eq!(datas(&at), vec![b"b", b"c", b"d"]);
    assert_eq!(at[0].sequence_number(), seqs[1]);
    let (after, _) = read_all(
        &k,
        "s",
        S0,
        StartingPoint::AfterSequence(seqs[1].clone()),
        10,
    )
    .await;
    assert_eq!(datas(&after), vec![b"c", b"d"]);
    let (after_last, _) = read_all(
        &k,
        "s",
        S0,
        StartingPoint::AfterSequence(seqs[3].clone()),
        10,
    )
    .await;
    assert!(after_last.is_empty());
}

#[tokio::test]
async fn at_timestamp() {
    let k = kinesis("s", 1);
    for d in ["a", "b"] {
        k.put("s", "k", d).expect("put");
    }
    std::thread::sleep(Duration::from_millis(3));
    let cut = SystemTime::now();
    std::thread::sleep(Duration::from_millis(3));
    for d in ["c", "d"] {
        k.put("s", "k", d).expect("put");
    }
    let (since, _) = read_all(&k, "s", S0, StartingPoint::at_time(cut), 10).await;
    assert_eq!(datas(&since), vec![b"c", b"d"]);
    let (all, _) = read_all(&k, "s", S0, StartingPoint::AtTimestamp(0), 10).await;
    assert_eq!(all.len(), 4);
    // A record's own arrival time opens at that record.
    let third = all[2].approximate_arrival().expect("arrival");
    let (from_third, _) = read_all(&k, "s", S0, StartingPoint::at_time(third), 10).await;
    assert_eq!(datas(&from_third), vec![b"c", b"d"]);
    let future = SystemTime::now() + Duration::from_secs(3600);
    let (none, _) = read_all(&k, "s", S0, StartingPoint::at_time(future), 10).await;
    assert!(none.is_empty());
}

#[tokio::test]
async fn iterator_requests_are_validated() {
    let k = kinesis("s", 2).with_region("eu-west-1");
    let (_, seq0) = k
        .put_records("s", vec![entry_at(0, b"x")])
        .await
        .map(|o| match &o.results[0] {
            PutRecordResult::Stored {
                shard_id,
                sequence_number,
            } => (shard_id.clone(), sequence_number.clone()),
            PutRecordResult::Failed { .. } => panic!("failed"),
        })
        .expect("put");

    let e = err(k
        .get_shard_iterator("s", S1, &StartingPoint::AtSequence(seq0.clone()))
        .await);
    assert_invalid(&e, "Invalid StartingSequenceNumber");
    assert_invalid(&e, "belongs to shard shardId-000000000000");
    let e = err(k
        .get_shard_iterator("s", S0, &StartingPoint::AfterSequence("12345".into()))
        .await);
    assert_invalid(
        &e,
        "Invalid StartingSequenceNumber 12345 for shard shardId-000000000000",
    );
    // A sequence number of another stream is refused too.
    k.add_stream("other", 2).expect("stream");
    let (_, other_seq) = k.put("other", "k", "x").expect("put");
    let e = err(k
        .get_shard_iterator("s", S0, &StartingPoint::AtSequence(other_seq))
        .await);
    assert_invalid(&e, "did not come from this stream");

    match err(k
        .get_shard_iterator("nope", S0, &StartingPoint::Latest)
        .await)
    {
        KinesisError::StreamNotFound {
            operation,
            stream,
            region,
            ..
        } => {
            assert_eq!(operation, Operation::GetShardIterator);
            assert_eq!(stream, "nope");
            assert_eq!(region, "eu-west-1");
        }
        other => panic!("{other:?}"),
    }
    for bad in ["shardId-000000000009", "shardId-0", "whatever"] {
        match err(k.get_shard_iterator("s", bad, &StartingPoint::Latest).await) {
            KinesisError::ShardNotFound { shard, .. } => assert_eq!(shard, bad),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(k.region(), "eu-west-1");
}

#[tokio::test(start_paused = true)]
async fn iterators_expire_after_the_ttl() {
    let k = kinesis("s", 1);
    k.put("s", "k", "a").expect("put");
    let shard: Arc<str> = S0.into();
    let it = iterator(&k, "s", S0, StartingPoint::TrimHorizon).await;
    tokio::time::advance(Duration::from_secs(299)).await;
    let page = k
        .get_records("s", &shard, it.clone(), 10)
        .await
        .expect("fresh");
    assert_eq!(page.records.len(), 1);
    // The next iterator is fresh even though the first is nearly five minutes old.
    tokio::time::advance(Duration::from_secs(2)).await;
    match err(k.get_records("s", &shard, it, 10).await) {
        e @ KinesisError::ExpiredIterator { .. } => assert!(e.is_expired_iterator()),
        other => panic!("{other:?}"),
    }
    let next = page.next_shard_iterator.expect("next");
    assert!(k.get_records("s", &shard, next, 10).await.is_ok());

    // The TTL is a setting.
    let short = kinesis("s", 1).with_iterator_ttl(Duration::from_secs(10));
    let it = iterator(&short, "s", S0, StartingPoint::Latest).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(err(short.get_records("s", &shard, it, 10).await).is_expired_iterator());
}

#[tokio::test]
async fn malformed_and_foreign_iterators_are_refused() {
    let k = kinesis("s", 2);
    let shard: Arc<str> = S0.into();
    let e = err(k.get_records("s", &shard, "garbage".into(), 10).await);
    assert_invalid(&e, "ShardIterator is malformed");
    // An iterator of another store.
    let other = kinesis("s", 2);
    let foreign = iterator(&other, "s", S0, StartingPoint::Latest).await;
    assert_invalid(
        &err(k.get_records("s", &shard, foreign, 10).await),
        "malformed",
    );
    // An iterator of another shard or stream.
    let it1 = iterator(&k, "s", S1, StartingPoint::Latest).await;
    assert_invalid(
        &err(k.get_records("s", &shard, it1, 10).await),
        "belongs to shard shardId-000000000001",
    );
    k.add_stream("t", 1).expect("stream");
    let it_t = iterator(&k, "t", S0, StartingPoint::Latest).await;
    assert_invalid(
        &err(k.get_records("s", &shard, it_t, 10).await),
        "belongs to stream t",
    );
    // The limit.
    let it = iterator(&k, "s", S0, StartingPoint::Latest).await;
    for limit in [0, 10_001] {
        assert_invalid(
            &err(k.get_records("s", &shard, it.clone(), limit).await),
            &format!("Limit {limit}"),
        );
    }
    assert!(k.get_records("s", &shard, it, 10_000).await.is_ok());
}

#[tokio::test]
async fn get_records_pages_and_reports_lag() {
    let k = kinesis("s", 1);
    for i in 0..25 {
        k.put("s", "k", Bytes::from(format!("{i}"))).expect("put");
    }
    let shard: Arc<str> = S0.into();
    let mut it = iterator(&k, "s", S0, StartingPoint::TrimHorizon).await;
    let mut sizes = Vec::new();
    let mut lags = Vec::new();
    for _ in 0..3 {
        let page = k.get_records("s", &shard, it, 10).await.expect("read");
        sizes.push(page.records.len());
        let lag = page.millis_behind_latest.expect("lag");
        lags.push(lag);
        assert!(
            page.records
                .iter()
                .all(|r| r.millis_behind_latest() == Some(lag))
        );
        it = page.next_shard_iterator.expect("open shard");
    }
    assert_eq!(sizes, vec![10, 10, 5]);
    assert!(lags[0] >= 1 && lags[1] >= 1, "behind the tip: {lags:?}");
    assert_eq!(lags[2], 0, "at the tip");
}

#[tokio::test]
async fn trim_drops_old_records_and_keeps_positions_valid() {
    let k = kinesis("s", 1);
    let mut seqs = Vec::new();
    for d in ["a", "b", "c"] {
        seqs.push(k.put("s", "k", d).expect("put").1);
    }
    let shard: Arc<str> = S0.into();
    let early = iterator(&k, "s", S0, StartingPoint::TrimHorizon).await;
    let after_a = iterator(&k, "s", S0, StartingPoint::AfterSequence(seqs[0].clone())).await;
    std::thread::sleep(Duration::from_millis(3));
    let cut = SystemTime::now();
    std::thread::sleep(Duration::from_millis(3));
    for d in ["d", "e"] {
        k.put("s", "k", d).expect("put");
    }
    assert_eq!(k.trim("s", cut), 3);
    assert_eq!(k.trim("s", cut), 0);
    assert_eq!(k.trim("nope", cut), 0);
    assert_eq!(
        datas(&k.records("s", S0).expect("records")),
        vec![b"d", b"e"]
    );

    // Iterators from before the trim read from the trim horizon.
    for it in [early, after_a] {
        let page = k.get_records("s", &shard, it, 10).await.expect("read");
        assert_eq!(datas(&page.records), vec![b"d", b"e"]);
    }
    let (horizon, _) = read_all(&k, "s", S0, StartingPoint::TrimHorizon, 10).await;
    assert_eq!(datas(&horizon), vec![b"d", b"e"]);
    // A trimmed record's sequence number still opens an iterator, at the trim horizon.
    let (at_trimmed, _) =
        read_all(&k, "s", S0, StartingPoint::AtSequence(seqs[1].clone()), 10).await;
    assert_eq!(datas(&at_trimmed), vec![b"d", b"e"]);
    // New records keep numbering after the trimmed ones.
    let (_, next) = k.put("s", "k", "f").expect("put");
    assert_eq!(cmp_sequence(&seqs[2], &next), std::cmp::Ordering::Less);
}
