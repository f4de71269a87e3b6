//! Splits, merges, shard lineage, and ListShards pages.

use super::*;

#[tokio::test]
async fn split_closes_the_parent_and_reports_children_at_its_end() {
    let k = kinesis("s", 1);
    let mut last_seq = String::new();
    for i in 0..5 {
        last_seq = k.put("s", &format!("k{i}"), "p").expect("put").1;
    }
    let middle = (u128::MAX / 2 + 1).to_string();
    k.split_shard("s", S0, &middle).await.expect("split");

    let shards = all_shards(&k, "s").await;
    let ids: Vec<&str> = shards.iter().map(|d| d.shard_id.as_str()).collect();
    assert_eq!(ids, vec![S0, S1, S2]);
    assert_eq!(
        shards[0].ending_sequence_number.as_deref(),
        Some(&*last_seq)
    );
    assert_eq!(shards[1].parent_shard_id.as_deref(), Some(S0));
    assert_eq!(shards[2].parent_shard_id.as_deref(), Some(S0));
    assert_eq!(shards[1].adjacent_parent_shard_id, None);
    assert_eq!(shards[1].starting_hash_key, "0");
    assert_eq!(
        shards[1].ending_hash_key,
        (u128::MAX / 2).to_string(),
        "the low child ends right before the split key"
    );
    assert_eq!(shards[2].starting_hash_key, middle);
    assert_eq!(shards[2].ending_hash_key, u128::MAX.to_string());
    assert!(shards[1].ending_sequence_number.is_none());
    assert_eq!(shards[2].parents().collect::<Vec<_>>(), vec![S0]);

    // New records go to the children.
    let (to, _) = k.put("s", "k0", "c").expect("put");
    assert!(to == S1 || to == S2);

    // Reading the parent: the call that reaches its end has no next iterator and the children.
    for limit in [2, 5, 100] {
        let (records, last) = read_all(&k, "s", S0, StartingPoint::TrimHorizon, limit).await;
        assert_eq!(records.len(), 5);
        assert_eq!(last.next_shard_iterator, None);
        assert_eq!(last.millis_behind_latest, Some(0));
        assert_eq!(
            last.child_shards,
            vec![
                ChildShard {
                    shard_id: S1.into(),
                    parent_shards: vec![S0.into()]
                },
                ChildShard {
                    shard_id: S2.into(),
                    parent_shards: vec![S0.into()]
                },
            ]
        );
    }
    // LATEST of a closed shard is its end.
    let shard: Arc<str> = S0.into();
    let it = iterator(&k, "s", S0, StartingPoint::Latest).await;
    let page = k.get_records("s", &shard, it, 10).await.expect("read");
    assert!(page.records.is_empty() && page.next_shard_iterator.is_none());
    assert_eq!(page.child_shards.len(), 2);

    let summary = k.describe_stream_summary("s").await.expect("summary");
    assert_eq!(summary.open_shard_count, 2);
}

#[tokio::test]
async fn merge_closes_both_parents_with_one_child() {
    let k = kinesis("s", 3);
    k.put_records("s", vec![entry_at(0, b"a")])
        .await
        .expect("put");
    k.merge_shards("s", S1, S0).await.expect("merge");
    let shards = all_shards(&k, "s").await;
    assert_eq!(shards.len(), 4);
    let child = &shards[3];
    assert_eq!(child.shard_id, S3);
    assert_eq!(child.parent_shard_id.as_deref(), Some(S1));
    assert_eq!(child.adjacent_parent_shard_id.as_deref(), Some(S0));
    assert_eq!(child.starting_hash_key, "0");
    assert_eq!(child.ending_hash_key, shards[1].ending_hash_key);
    assert!(shards[0].ending_sequence_number.is_some());
    assert!(shards[1].ending_sequence_number.is_some());
    assert!(shards[2].ending_sequence_number.is_none());

    let expected = vec![ChildShard {
        shard_id: S3.into(),
        parent_shards: vec![S1.into(), S0.into()],
    }];
    for parent in [S0, S1] {
        let (_, last) = read_all(&k, "s", parent, StartingPoint::TrimHorizon, 10).await;
        assert_eq!(last.next_shard_iterator, None);
        assert_eq!(last.child_shards, expected);
    }
    let (to, _) = k
        .put_records("s", vec![entry_at(0, b"b")])
        .await
        .map(|o| match &o.results[0] {
            PutRecordResult::Stored {
                shard_id,
                sequence_number,
            } => (shard_id.clone(), sequence_number.clone()),
            PutRecordResult::Failed { .. } => panic!("failed"),
        })
        .expect("put");
    assert_eq!(to, S3);
    assert_eq!(
        k.describe_stream_summary("s")
            .await
            .expect("summary")
            .open_shard_count,
        2
    );
}

#[tokio::test]
async fn an_empty_closed_shard_ends_at_once() {
    let k = kinesis("s", 1);
    k.split_shard("s", S0, "1000").await.expect("split");
    let shards = all_shards(&k, "s").await;
    let ending = shards[0].ending_sequence_number.clone().expect("closed");
    assert_eq!(ending.len(), 56);
    for start in [
        StartingPoint::TrimHorizon,
        StartingPoint::AfterSequence(ending.clone()),
        StartingPoint::AtSequence(ending),
    ] {
        let (records, last) = read_all(&k, "s", S0, start, 10).await;
        assert!(records.is_empty());
        assert_eq!(last.next_shard_iterator, None);
        assert_eq!(last.child_shards.len(), 2);
    }
    // A child's first record is numbered after the parent's range of sequence numbers.
    let child_seq = k.put("s", "k", "x").expect("put").1;
    assert_eq!(
        cmp_sequence(&shards[0].starting_sequence_number, &child_seq),
        std::cmp::Ordering::Less
    );
}

#[tokio::test]
async fn resharding_is_validated_like_the_service() {
    let k = kinesis("s", 3);
    let shards = all_shards(&k, "s").await;
    let start1 = shards[1].starting_hash_key.clone();
    let end1 = shards[1].ending_hash_key.clone();

    assert_invalid(
        &err(k.split_shard("s", S1, &start1).await),
        "NewStartingHashKey",
    );
    let past_end = (end1.parse::<u128>().expect("end") + 1).to_string();
    assert_invalid(&err(k.split_shard("s", S1, &past_end).await), "not inside");
    assert_invalid(&err(k.split_shard("s", S1, "12ab").await), "12ab");
    assert_invalid(&err(k.split_shard("s", S1, "-5").await), "-5");
    assert!(
        k.split_shard("s", S1, &end1).await.is_ok(),
        "the end is inside"
    );
    assert_invalid(&err(k.split_shard("s", S1, &end1).await), "closed");
    assert!(matches!(
        err(k.split_shard("s", "shardId-000000000099", "5").await),
        KinesisError::ShardNotFound { .. }
    ));
    assert!(matches!(
        err(k.split_shard("nope", S0, "5").await),
        KinesisError::StreamNotFound { .. }
    ));

    // Shards 0 and 2 are not adjacent; 1 is closed; a shard is not adjacent to itself.
    assert_invalid(&err(k.merge_shards("s", S0, S2).await), "not adjacent");
    assert_invalid(&err(k.merge_shards("s", S0, S1).await), "closed");
    assert_invalid(&err(k.merge_shards("s", S0, S0).await), "itself");
    assert!(matches!(
        err(k.merge_shards("s", S0, "shardId-000000000099").await),
        KinesisError::ShardNotFound { shard, .. } if shard == "shardId-000000000099"
    ));
    // Shard 0 and the low child of shard 1 are adjacent.
    k.merge_shards("s", S0, S3).await.expect("merge");
    assert_eq!(
        k.describe_stream_summary("s")
            .await
            .expect("summary")
            .open_shard_count,
        3
    );
}

#[tokio::test]
async fn list_shards_paginates() {
    let k = kinesis("s", 5).with_list_shards_page_size(2);
    k.add_stream("t", 1).expect("stream");
    let first = k.list_shards("s", None).await.expect("page");
    assert_eq!(first.shards.len(), 2);
    let token = first.next_token.clone().expect("more");
    let second = k.list_shards("s", Some(token.clone())).await.expect("page");
    let third = k
        .list_shards("s", second.next_token.clone())
        .await
        .expect("page");
    assert_eq!(third.shards.len(), 1);
    assert_eq!(third.next_token, None);
    let ids: Vec<String> = [first, second, third]
        .into_iter()
        .flat_map(|p| p.shards)
        .map(|d| d.shard_id)
        .collect();
    let expected: Vec<String> = (0..5).map(|n| format!("shardId-{n:012}")).collect();
    assert_eq!(ids, expected);

    assert_invalid(&err(k.list_shards("t", Some(token)).await), "NextToken");
    assert_invalid(
        &err(k.list_shards("s", Some("bogus".into())).await),
        "NextToken",
    );
    // Exactly one full page has no next token.
    let exact = kinesis("s", 2).with_list_shards_page_size(2);
    assert_eq!(
        exact.list_shards("s", None).await.expect("page").next_token,
        None
    );
    assert!(matches!(
        err(k.list_shards("nope", None).await),
        KinesisError::StreamNotFound { .. }
    ));
}

#[tokio::test]
async fn a_closed_shard_leaves_the_listing_once_retention_trimmed_it() {
    let k = kinesis("s", 1);
    k.put("s", "k", "old").expect("put");
    let middle = (u128::MAX / 2 + 1).to_string();
    k.split_shard("s", S0, &middle).await.expect("split");
    let it = iterator(&k, "s", S0, StartingPoint::TrimHorizon).await;
    std::thread::sleep(Duration::from_millis(3));
    let cut = SystemTime::now();
    std::thread::sleep(Duration::from_millis(3));
    k.put("s", "k", "new").expect("put");

    // Open shards stay listed however much is trimmed; the closed parent, emptied, goes.
    assert_eq!(k.trim("s", cut), 1);
    let ids: Vec<String> = all_shards(&k, "s")
        .await
        .into_iter()
        .map(|d| d.shard_id)
        .collect();
    assert_eq!(ids, vec![S1.to_owned(), S2.to_owned()]);
    let shard: Arc<str> = S0.into();
    for error in [
        err(k.get_records("s", &shard, it, 10).await),
        err(k
            .get_shard_iterator("s", S0, &StartingPoint::TrimHorizon)
            .await),
    ] {
        assert!(
            matches!(&error, KinesisError::ShardNotFound { shard, .. } if shard == S0),
            "{error:?}"
        );
    }
    // The children keep their lineage.
    let children = all_shards(&k, "s").await;
    assert!(
        children
            .iter()
            .all(|c| c.parent_shard_id.as_deref() == Some(S0))
    );
}

#[tokio::test]
async fn a_shard_expiring_between_pages_makes_no_page_skip_one() {
    let k = MemoryKinesis::new().with_list_shards_page_size(1);
    k.add_stream("s", 1).expect("stream");
    let middle = (u128::MAX / 2 + 1).to_string();
    // Trimmed before it closed: an empty shard is kept until it has been closed past the cut.
    assert_eq!(k.trim("s", SystemTime::now()), 0);
    k.split_shard("s", S0, &middle).await.expect("split");
    assert_eq!(
        all_shards(&k, "s").await.len(),
        3,
        "closed after the cut: kept"
    );

    let first = k.list_shards("s", None).await.expect("page 1");
    assert_eq!(first.shards[0].shard_id, S0);
    std::thread::sleep(Duration::from_millis(3));
    k.trim("s", SystemTime::now());
    let second = k.list_shards("s", first.next_token).await.expect("page 2");
    assert_eq!(
        second.shards[0].shard_id, S1,
        "the next shard, not the one after"
    );
    let third = k.list_shards("s", second.next_token).await.expect("page 3");
    assert_eq!(third.shards[0].shard_id, S2);
    assert_eq!(third.next_token, None);
}
