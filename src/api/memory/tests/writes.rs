//! Routing, sequence numbers, and what PutRecords and CreateStream refuse.

use super::*;

#[tokio::test]
async fn hashing_routes_a_key_consistently_and_spreads_keys() {
    let k = kinesis("s", 4);
    let shards = all_shards(&k, "s").await;
    let (first, _) = k.put("s", "customer-42", "a").expect("put");
    for _ in 0..10 {
        assert_eq!(k.put("s", "customer-42", "b").expect("put").0, first);
    }

    let mut per_shard: HashMap<String, usize> = HashMap::new();
    for i in 0..2000 {
        let key = format!("key-{i}");
        let (shard, _) = k.put("s", &key, "x").expect("put");
        // The shard's range holds the key's MD5, read as a big-endian u128.
        let hash = super::super::hash_key(&key);
        let desc = shards.iter().find(|d| d.shard_id == shard).expect("listed");
        let start: u128 = desc.starting_hash_key.parse().expect("start");
        let end: u128 = desc.ending_hash_key.parse().expect("end");
        assert!(start <= hash && hash <= end, "{key} landed outside {shard}");
        *per_shard.entry(shard).or_default() += 1;
    }
    assert_eq!(per_shard.len(), 4);
    assert!(per_shard.values().all(|&n| n > 350), "{per_shard:?}");

    // An explicit hash key overrides the partition key.
    let out = k
        .put_records("s", vec![entry_at(0, b"lo"), entry_at(u128::MAX, b"hi")])
        .await
        .expect("put");
    let shard_ids: Vec<&str> = out
        .results
        .iter()
        .map(|r| match r {
            PutRecordResult::Stored { shard_id, .. } => shard_id.as_str(),
            PutRecordResult::Failed { .. } => panic!("failed"),
        })
        .collect();
    assert_eq!(shard_ids, vec![S0, S3]);
}

#[tokio::test]
async fn sequence_numbers_increase_within_a_shard_and_are_unique() {
    let k = kinesis("s", 3);
    let mut last: HashMap<String, String> = HashMap::new();
    let mut seen = HashSet::new();
    for i in 0..300 {
        let (shard, seq) = k.put("s", &format!("k{i}"), "x").expect("put");
        assert_eq!(seq.len(), 56);
        assert!(seq.bytes().all(|b| b.is_ascii_digit()));
        assert!(seen.insert(seq.clone()), "duplicate {seq}");
        if let Some(prev) = last.insert(shard, seq.clone()) {
            assert_eq!(cmp_sequence(&prev, &seq), std::cmp::Ordering::Less);
        }
    }
    // Arrival timestamps never decrease within a shard.
    for shard in [S0, S1, S2] {
        let records = k.records("s", shard).expect("records");
        let arrivals: Vec<SystemTime> = records
            .iter()
            .filter_map(Record::approximate_arrival)
            .collect();
        assert_eq!(arrivals.len(), records.len());
        assert!(arrivals.windows(2).all(|w| w[0] <= w[1]));
    }
}

#[tokio::test]
async fn put_records_are_validated_like_the_service() {
    let k = kinesis("s", 1);
    let many: Vec<PutRecordsEntry> = (0..501).map(|_| entry("k", b"x")).collect();
    assert_invalid(&err(k.put_records("s", many).await), "501");
    assert_invalid(&err(k.put_records("s", Vec::new()).await), "holds 0");
    assert_invalid(
        &err(k
            .put_records("s", vec![entry("k", b"x"), entry("", b"x")])
            .await),
        "Records[1].PartitionKey",
    );
    let long = "k".repeat(257);
    assert_invalid(
        &err(k.put_records("s", vec![entry(&long, b"x")]).await),
        "(it has 257)",
    );
    assert!(k.put("s", &"k".repeat(256), "x").is_ok());
    // Characters, not bytes.
    assert!(k.put("s", &"é".repeat(256), "x").is_ok());
    let big = PutRecordsEntry {
        data: Bytes::from(vec![0_u8; 1024 * 1024]),
        ..entry("k", b"")
    };
    assert_invalid(&err(k.put_records("s", vec![big]).await), "Records[0].Data");
    assert_invalid(&err(k.put("s", "k", vec![0_u8; 1024 * 1024])), "Data");
    let chunk = PutRecordsEntry {
        data: Bytes::from(vec![0_u8; 900_000]),
        ..entry("k", b"")
    };
    assert_invalid(
        &err(k.put_records("s", vec![chunk; 6]).await),
        "at most 5242880",
    );
    let bad_hash = PutRecordsEntry {
        explicit_hash_key: Some("abc".into()),
        ..entry("k", b"x")
    };
    assert_invalid(
        &err(k.put_records("s", vec![bad_hash]).await),
        "Records[0].ExplicitHashKey",
    );
    // The service's pattern is `0|([1-9]\d{0,38})`: no leading zeros, at most 39 digits, and
    // the value at most 2^128 - 1; one bad key refuses the whole call.
    for bad in [
        "007",
        "00",
        "0000000000000000000000000000000000000001",
        "1000000000000000000000000000000000000000",
        "340282366920938463463374607431768211456",
    ] {
        let bad_hash = PutRecordsEntry {
            explicit_hash_key: Some(bad.into()),
            ..entry("k", b"x")
        };
        assert_invalid(
            &err(k.put_records("s", vec![entry("k", b"x"), bad_hash]).await),
            "Records[1].ExplicitHashKey",
        );
    }
    assert!(matches!(
        err(k.put_records("nope", vec![entry("k", b"x")]).await),
        KinesisError::StreamNotFound { .. }
    ));
    assert!(matches!(
        err(k.put("nope", "k", "x")),
        KinesisError::StreamNotFound { .. }
    ));
    // Nothing refused was stored.
    assert_eq!(k.records("s", S0).expect("records").len(), 2);
}

#[tokio::test]
async fn streams_are_created_and_described_like_the_service() {
    let k = MemoryKinesis::new().with_region("us-east-2");
    k.create_stream("orders", 4).await.expect("create");
    let summary = k.describe_stream_summary("orders").await.expect("summary");
    assert_eq!(summary.stream_name, "orders");
    assert_eq!(summary.status, StreamStatus::Active);
    assert_eq!(summary.open_shard_count, 4);
    assert_eq!(summary.retention_period_hours, 24);

    for e in [
        err(k.create_stream("orders", 1).await),
        err(k.add_stream("orders", 1)),
    ] {
        assert!(
            matches!(&e, KinesisError::ResourceInUse { message, .. } if message.contains("already exists")),
            "{e:?}"
        );
    }
    assert_invalid(&err(k.create_stream("zero", 0).await), "ShardCount 0");
    assert_invalid(&err(k.add_stream("bad name", 1)), "bad name");
    assert_invalid(&err(k.add_stream("", 1)), "1 to 128");
    assert_invalid(&err(k.add_stream(&"x".repeat(129), 1)), "1 to 128");
    assert!(k.add_stream(&"x".repeat(128), 1).is_ok());
    // A malformed name is refused by every call, before the lookup.
    assert_invalid(&err(k.describe_stream_summary("a/b").await), "a/b");
    match err(k.describe_stream_summary("missing").await) {
        KinesisError::StreamNotFound { region, .. } => assert_eq!(region, "us-east-2"),
        other => panic!("{other:?}"),
    }
}
