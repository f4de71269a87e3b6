//! `kinesis-dataflow kcl import` / `kcl export` against kinesis-local and dynalite, on KCL
//! lease tables written here with the KCL's own attribute names and types (single-stream 2.x,
//! multi-stream 3.x with rows of other kinds, a checkpoint inside an aggregate made by AWS's
//! `aws-kinesis-agg`, a split): a subscription started on an import delivers exactly the
//! records after each KCL checkpoint, parents before children; an export reads back with the
//! KCL's schema and imports to the same positions; every refusal and every kind of bad input
//! writes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_kinesis::primitives::Blob;
use common::{Run, cli};
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::lease::{Lease, LeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, ReadSettings, Subscription};
use kinesis_dataflow_test_support as support;

mod common;

/// The first hash key of the upper half of the key space.
const UPPER: u128 = 1 << 127;

/// A stream, a KCL table and an application table, with the clients to fill them.
struct Fixture {
    kinesis: aws_sdk_kinesis::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    api: SharedKinesis,
    stream: String,
    kcl_table: String,
    app_table: String,
}

impl Fixture {
    /// A stream of `shards` shards and an empty KCL table (the KCL's key).
    async fn new(prefix: &str, shards: i32) -> Self {
        let kinesis = support::kinesis_client();
        let dynamodb = support::dynamodb_client();
        let stream = support::unique_name(prefix);
        support::create_stream(&kinesis, &stream, shards).await;
        let kcl_table = support::unique_name(&format!("{prefix}-kcl"));
        support::create_table_keyed_by(&dynamodb, &kcl_table, "leaseKey").await;
        Self {
            api: Arc::new(AwsKinesis::new(kinesis.clone())),
            app_table: support::unique_name(&format!("{prefix}-app")),
            kinesis,
            dynamodb,
            stream,
            kcl_table,
        }
    }

    /// Puts one plain record whose partition key and data are `payload`, at `hash_key`.
    async fn put(&self, payload: &str, hash_key: u128) -> String {
        let put = self
            .kinesis
            .put_record()
            .stream_name(&self.stream)
            .partition_key(payload)
            .explicit_hash_key(hash_key.to_string())
            .data(Blob::new(payload.as_bytes().to_vec()))
            .send()
            .await
            .unwrap();
        put.sequence_number().to_owned()
    }

    /// Puts one KPL aggregate of `users` (made by `aws-kinesis-agg`) at `hash_key`.
    async fn put_aggregate(&self, users: &[&str], hash_key: u128) -> String {
        let records: Vec<support::kpl::UserRecord> = users
            .iter()
            .map(|u| ((*u).to_owned(), None, u.as_bytes().to_vec()))
            .collect();
        let aggregates = support::kpl::reference_aggregate(&records);
        assert_eq!(aggregates.len(), 1, "one aggregate");
        let (key, data) = &aggregates[0];
        let put = self
            .kinesis
            .put_record()
            .stream_name(&self.stream)
            .partition_key(key)
            .explicit_hash_key(hash_key.to_string())
            .data(Blob::new(data.clone()))
            .send()
            .await
            .unwrap();
        put.sequence_number().to_owned()
    }

    async fn split(&self, shard: &str, at: u128) {
        AwsKinesis::new(self.kinesis.clone())
            .split_shard(&self.stream, shard, &at.to_string())
            .await
            .unwrap();
        support::wait_active(&self.kinesis, &self.stream).await;
    }

    async fn kcl_put(&self, table: &str, item: HashMap<String, AttributeValue>) {
        self.dynamodb
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }

    /// `kcl <direction> --kcl-table K --table T --stream S` with short watches, then `extra`.
    async fn kcl(&self, direction: &str, kcl_table: &str, app_table: &str, extra: &[&str]) -> Run {
        let mut args = vec![
            "kcl",
            direction,
            "--kcl-table",
            kcl_table,
            "--table",
            app_table,
            "--stream",
            &self.stream,
            "--kcl-failover-ms",
            "600",
            "--lease-duration",
            "1",
        ];
        args.extend_from_slice(extra);
        cli(&args).await
    }

    async fn import(&self, extra: &[&str]) -> Run {
        self.kcl("import", &self.kcl_table, &self.app_table, extra)
            .await
    }

    /// The application table's shard rows: shard id → encoded checkpoint.
    async fn app_rows(&self, table: &str) -> BTreeMap<String, Option<String>> {
        let store = DynamoLeaseStore::new(self.dynamodb.clone(), table).unwrap();
        store
            .list(&self.stream)
            .await
            .unwrap()
            .into_iter()
            .filter(|l| !l.shard_id.starts_with("worker:"))
            .map(|l| (l.shard_id, l.checkpoint.map(|c| c.encode())))
            .collect()
    }

    /// Whether table `table` exists.
    async fn table_exists(&self, table: &str) -> bool {
        match self
            .dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
        {
            Ok(_) => true,
            Err(err) => {
                use aws_sdk_dynamodb::error::ProvideErrorMetadata;
                assert_eq!(err.code(), Some("ResourceNotFoundException"), "{err:?}");
                false
            }
        }
    }

    /// Every item of `table`, by `leaseKey`.
    async fn items(&self, table: &str) -> BTreeMap<String, HashMap<String, AttributeValue>> {
        let scan = self.dynamodb.scan().table_name(table).send().await.unwrap();
        scan.items()
            .iter()
            .map(|item| (s_of(item, "leaseKey"), item.clone()))
            .collect()
    }

    /// A de-aggregating subscription on `table`, as a KCL application reads.
    async fn subscribe(&self, table: &str, owner: &str) -> Subscription {
        let store = Arc::new(DynamoLeaseStore::new(self.dynamodb.clone(), table).unwrap());
        support::timings::with_fast_timings(Subscription::builder(
            self.api.clone(),
            store,
            self.stream.as_str(),
        ))
        .owner(owner)
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .unlimited_reads()
                .deaggregate(true),
        )
        .start()
        .await
        .unwrap()
    }
}

fn s_of(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    match item.get(name) {
        Some(AttributeValue::S(s)) => s.clone(),
        other => panic!("{name} is {other:?} in {item:?}"),
    }
}

fn n_of(item: &HashMap<String, AttributeValue>, name: &str) -> u64 {
    match item.get(name) {
        Some(AttributeValue::N(n)) => n.parse().unwrap(),
        other => panic!("{name} is {other:?}, not N, in {item:?}"),
    }
}

/// A KCL lease row as the KCL's `DynamoDBLeaseSerializer` writes it.
struct KclRow(HashMap<String, AttributeValue>);

impl KclRow {
    fn new(key: &str, checkpoint: &str, sub: u64) -> Self {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: u64| AttributeValue::N(v.to_string());
        Self(HashMap::from([
            ("leaseKey".to_owned(), s(key)),
            ("leaseCounter".to_owned(), n(7)),
            ("ownerSwitchesSinceCheckpoint".to_owned(), n(0)),
            ("checkpoint".to_owned(), s(checkpoint)),
            ("checkpointSubSequenceNumber".to_owned(), n(sub)),
        ]))
    }

    fn set(mut self, name: &str, value: AttributeValue) -> Self {
        self.0.insert(name.to_owned(), value);
        self
    }

    fn owner(self, owner: &str) -> Self {
        self.set("leaseOwner", AttributeValue::S(owner.to_owned()))
    }

    fn parents(self, parents: &[&str]) -> Self {
        let set = parents.iter().map(|p| (*p).to_owned()).collect();
        self.set("parentShardId", AttributeValue::Ss(set))
    }

    /// KCL 2.x: the hash range (1.x wrote none).
    fn v2(self, start: u128, end: u128) -> Self {
        self.set("startingHashKey", AttributeValue::S(start.to_string()))
            .set("endingHashKey", AttributeValue::S(end.to_string()))
    }

    /// KCL 3.x: the entity type too.
    fn v3(self) -> Self {
        self.v2(0, u128::MAX)
            .set("entityType", AttributeValue::S("LEASE".to_owned()))
    }

    /// Multi-stream mode: `streamName` and `shardId` beside the composite key.
    fn multi(self, stream_id: &str, shard: &str) -> Self {
        self.set("streamName", AttributeValue::S(stream_id.to_owned()))
            .set("shardId", AttributeValue::S(shard.to_owned()))
    }
}

fn shard(n: u32) -> String {
    format!("shardId-{n:012}")
}

async fn read(sub: &mut Subscription, expected: &BTreeSet<String>, what: &str) -> Vec<String> {
    support::read_until(sub, expected, what, Duration::from_secs(30))
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect()
}

/// Single-stream, KCL 1.x and 2.x rows (with and without hash ranges): shard 0 checkpointed
/// inside an aggregate, shard 1 part-read and split, one child with a lease (TRIM_HORIZON),
/// one without. After the import a subscription delivers exactly the records after each
/// checkpoint, the parent's before the children's. Then the export round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_resumes_right_after_each_kcl_checkpoint_and_exports_back() {
    support::init_tracing();
    let fx = Fixture::new("kcl-import", 2).await;
    for i in 0..3 {
        fx.put(&format!("p-{i}"), 1).await;
    }
    let aggregate = fx
        .put_aggregate(&["agg-0", "agg-1", "agg-2", "agg-3"], 1)
        .await;
    let mut parent = Vec::new();
    for i in 0..6 {
        parent.push(fx.put(&format!("q-{i}"), UPPER + 1).await);
    }
    fx.split(&shard(1), UPPER + (UPPER >> 1)).await;
    let mut children = BTreeSet::new();
    for i in 0..10 {
        let at = if i % 2 == 0 { UPPER + 1 } else { u128::MAX - 1 };
        fx.put(&format!("c-{i}"), at).await;
        children.insert(format!("c-{i}"));
    }
    // What the KCL left: shard 0 after user record 1 of the aggregate; shard 1 after q-2; the
    // first child leased at TRIM_HORIZON, the second not yet.
    let kcl = &fx.kcl_table;
    fx.kcl_put(
        kcl,
        KclRow::new(&shard(0), &aggregate, 1)
            .owner("kcl-worker-1")
            .0,
    )
    .await;
    fx.kcl_put(
        kcl,
        KclRow::new(&shard(1), &parent[2], 0)
            .owner("kcl-worker-1")
            .v2(UPPER, u128::MAX)
            .0,
    )
    .await;
    fx.kcl_put(
        kcl,
        KclRow::new(&shard(2), "TRIM_HORIZON", 0)
            .parents(&[&shard(1)])
            .v2(UPPER, UPPER + (UPPER >> 1) - 1)
            .0,
    )
    .await;

    let dry = fx.import(&["--dry-run"]).await.ok();
    assert!(dry.stdout.contains("dry run: nothing written"), "{dry:#?}");
    assert!(
        !fx.table_exists(&fx.app_table).await,
        "a dry run creates nothing"
    );

    let import = fx.import(&[]).await.ok();
    for needle in [
        "KCL CHECKPOINT",
        "kcl-worker-1",
        &format!("{aggregate} (sub 1)"),
        "imported 3 shards",
    ] {
        assert!(import.stdout.contains(needle), "{needle}: {import:#?}");
    }
    let mut expected: BTreeSet<String> = ["agg-2", "agg-3", "q-3", "q-4", "q-5"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    expected.extend(children.iter().cloned());
    let mut sub = fx.subscribe(&fx.app_table, "after-import").await;
    let got = read(
        &mut sub,
        &expected,
        "the records after the KCL's checkpoints",
    )
    .await;
    sub.shutdown().await;
    assert_eq!(
        got.len(),
        expected.len(),
        "nothing before a checkpoint, nothing twice: {got:?}"
    );
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), expected);
    let last_parent = got.iter().rposition(|p| p.starts_with("q-")).unwrap();
    let first_child = got.iter().position(|p| p.starts_with("c-")).unwrap();
    assert!(
        last_parent < first_child,
        "the parent's records first: {got:?}"
    );
    assert!(got.iter().position(|p| p == "agg-2") < got.iter().position(|p| p == "agg-3"));

    export_reads_back_with_the_kcl_schema(&fx, &aggregate).await;
}

/// The application's checkpoints exported to a new KCL table (`--create`): the KCL's types,
/// no owners, the aggregate settled through its last user record; imported again into a
/// fresh application table, the same checkpoints.
async fn export_reads_back_with_the_kcl_schema(fx: &Fixture, aggregate: &str) {
    let original = fx.app_rows(&fx.app_table).await;
    assert_eq!(original.len(), 4, "{original:?}");
    let exported = support::unique_name("kcl-export");
    let missing = fx.kcl("export", &exported, &fx.app_table, &[]).await;
    assert_eq!(missing.code, 2, "no --create: {missing:#?}");
    assert!(missing.stderr.contains(&exported), "{missing:#?}");

    let export = fx
        .kcl("export", &exported, &fx.app_table, &["--create"])
        .await
        .ok();
    assert!(export.stdout.contains("exported 4 shards"), "{export:#?}");
    let items = fx.items(&exported).await;
    assert_eq!(items.len(), 4, "{items:?}");
    for (key, item) in &items {
        assert!(!item.contains_key("leaseOwner"), "{key}: no owner");
        n_of(item, "leaseCounter");
        n_of(item, "ownerSwitchesSinceCheckpoint");
        assert_eq!(s_of(item, "entityType"), "LEASE");
    }
    let zero = &items[&shard(0)];
    assert_eq!(s_of(zero, "checkpoint"), aggregate);
    assert_eq!(
        n_of(zero, "checkpointSubSequenceNumber"),
        3,
        "through agg-3"
    );
    assert_eq!(s_of(&items[&shard(1)], "checkpoint"), "SHARD_END");
    assert_eq!(
        items[&shard(1)].get("childShardIds"),
        Some(&AttributeValue::Ss(vec![shard(2), shard(3)]))
    );
    assert_eq!(
        items[&shard(3)].get("parentShardId"),
        Some(&AttributeValue::Ss(vec![shard(1)]))
    );
    for child in [2, 3] {
        let item = &items[&shard(child)];
        assert_eq!(
            Some(s_of(item, "checkpoint")),
            original[&shard(child)].clone(),
            "the child's last record"
        );
        assert_eq!(n_of(item, "checkpointSubSequenceNumber"), 0);
    }

    let again = support::unique_name("kcl-reimport");
    fx.kcl("import", &exported, &again, &[]).await.ok();
    assert_eq!(fx.app_rows(&again).await, original, "import of an export");
}

/// Multi-stream, KCL 3.x: the table also holds another stream's leases and rows of other
/// kinds; the stream's parent is finished and both children part-read. Only the stream's
/// rows count; the subscription delivers exactly the children's records after their
/// checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_stream_kcl_3_table_imports_its_stream_only() {
    support::init_tracing();
    let fx = Fixture::new("kcl-multi", 1).await;
    for i in 0..3 {
        fx.put(&format!("x-{i}"), 1).await;
    }
    fx.split(&shard(0), UPPER).await;
    let (mut low, mut high) = (Vec::new(), Vec::new());
    for i in 0..6 {
        low.push((format!("lo-{i}"), fx.put(&format!("lo-{i}"), 1).await));
        high.push((
            format!("hi-{i}"),
            fx.put(&format!("hi-{i}"), UPPER + 1).await,
        ));
    }
    let id = format!("123456789012:{}:1700000000", fx.stream);
    let key = |n: u32| format!("{id}:{}", shard(n));
    let kcl = &fx.kcl_table;
    let row = |n: u32, checkpoint: &str| {
        KclRow::new(&key(n), checkpoint, 0)
            .v3()
            .multi(&id, &shard(n))
    };
    fx.kcl_put(
        kcl,
        row(0, "SHARD_END")
            .set(
                "childShardIds",
                AttributeValue::Ss(vec![shard(1), shard(2)]),
            )
            .0,
    )
    .await;
    fx.kcl_put(kcl, row(1, &low[1].1).parents(&[&shard(0)]).0)
        .await;
    fx.kcl_put(kcl, row(2, &high[3].1).parents(&[&shard(0)]).0)
        .await;
    let other = "123456789012:another-stream:1700000000";
    fx.kcl_put(
        kcl,
        KclRow::new(&format!("{other}:{}", shard(0)), "TRIM_HORIZON", 0)
            .v3()
            .multi(other, &shard(0))
            .0,
    )
    .await;
    for (leader, kind) in [("Leader", "LEADER"), ("worker-1", "WORKER_METRIC_STATS")] {
        let item = HashMap::from([
            ("leaseKey".to_owned(), AttributeValue::S(leader.to_owned())),
            ("entityType".to_owned(), AttributeValue::S(kind.to_owned())),
        ]);
        fx.kcl_put(kcl, item).await;
    }

    let import = fx.import(&["--json"]).await.ok().json();
    assert_eq!(import["kcl_stream"], id.as_str(), "{import:#}");
    assert_eq!(import["writes"], 3, "{import:#}");
    let expected: BTreeSet<String> = low[2..]
        .iter()
        .chain(&high[4..])
        .map(|(p, _)| p.clone())
        .collect();
    let mut sub = fx.subscribe(&fx.app_table, "after-multi-import").await;
    let got = read(
        &mut sub,
        &expected,
        "the children's records after their checkpoints",
    )
    .await;
    sub.shutdown().await;
    assert_eq!(got.len(), expected.len(), "nothing else: {got:?}");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected);

    // Another stream's name finds no lease of its own here.
    let elsewhere = Fixture::new("kcl-multi-other", 1).await;
    let none = elsewhere
        .kcl("import", kcl, &elsewhere.app_table, &[])
        .await;
    assert_eq!(none.code, 2, "{none:#?}");
    assert!(
        none.stderr.contains("holds no lease of stream") && none.stderr.contains("another-stream"),
        "{none:#?}"
    );
    assert!(!fx.table_exists(&elsewhere.app_table).await);
}

/// Bad input exits 2 and live KCL workers exit 3, the application table never created;
/// `--force` overrides live KCL workers; live instances of the application refuse an import
/// and an export, their rows unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_bad_input_write_nothing() {
    support::init_tracing();
    let fx = Fixture::new("kcl-refuse", 1).await;
    let seq = fx.put("r-0", 1).await;
    bad_input_names_what_is_wrong(&fx, &seq).await;
    assert!(!fx.table_exists(&fx.app_table).await, "nothing written");
    live_kcl_workers_refuse_unless_forced(&fx, &seq).await;
    live_instances_refuse_import_and_export(&fx).await;
}

async fn bad_input_names_what_is_wrong(fx: &Fixture, seq: &str) {
    let app = fx.app_table.as_str();
    let unknown = fx.kcl("import", "no-such-kcl-table", app, &[]).await;
    assert_eq!(unknown.code, 2, "{unknown:#?}");
    assert!(
        unknown
            .stderr
            .contains("`no-such-kcl-table` does not exist"),
        "{unknown:#?}"
    );

    // The library's own lease table is no KCL table.
    let ours = support::unique_name("kcl-ours");
    let store = DynamoLeaseStore::new(fx.dynamodb.clone(), &ours).unwrap();
    store.prepare().await.unwrap();
    store
        .create(&Lease::new(&fx.stream, shard(0), Vec::new()))
        .await
        .unwrap();
    let not_kcl = fx.kcl("import", &ours, app, &[]).await;
    assert_eq!(not_kcl.code, 2, "{not_kcl:#?}");
    assert!(
        not_kcl.stderr.contains("is not a KCL lease table")
            && not_kcl.stderr.contains("kinesis-dataflow lease table"),
        "{not_kcl:#?}"
    );

    let malformed = support::unique_name("kcl-malformed");
    support::create_table_keyed_by(&fx.dynamodb, &malformed, "leaseKey").await;
    let bad = KclRow::new(&shard(0), seq, 0).set("leaseCounter", AttributeValue::S("7".into()));
    fx.kcl_put(&malformed, bad.0).await;
    let run = fx.kcl("import", &malformed, app, &[]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    for needle in [
        malformed.as_str(),
        &shard(0),
        "`leaseCounter`",
        "expected N",
    ] {
        assert!(run.stderr.contains(needle), "{needle}: {run:#?}");
    }

    let empty = support::unique_name("kcl-empty");
    support::create_table_keyed_by(&fx.dynamodb, &empty, "leaseKey").await;
    let run = fx.kcl("import", &empty, app, &[]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("holds no lease of stream"), "{run:#?}");

    // LATEST holds no position: refused, naming the shard, unless told.
    fx.kcl_put(&fx.kcl_table, KclRow::new(&shard(0), "LATEST", 0).0)
        .await;
    let latest = fx.import(&[]).await;
    assert_eq!(latest.code, 2, "{latest:#?}");
    for needle in [
        &format!("{} (KCL checkpoint LATEST)", shard(0)),
        "--unprocessed-from",
    ] {
        assert!(latest.stderr.contains(needle), "{needle}: {latest:#?}");
    }
    let told = fx
        .import(&["--unprocessed-from", "horizon", "--dry-run"])
        .await
        .ok();
    assert!(told.stdout.contains("from TRIM_HORIZON"), "{told:#?}");

    // An application table with another key is no lease table.
    let wrong_key = support::unique_name("kcl-wrong-key");
    support::create_table_keyed_by(&fx.dynamodb, &wrong_key, "id").await;
    let wrong = fx.kcl("import", &fx.kcl_table, &wrong_key, &[]).await;
    assert_eq!(wrong.code, 2, "{wrong:#?}");
    assert!(wrong.stderr.contains(&wrong_key), "{wrong:#?}");

    let export = fx.kcl("export", &fx.kcl_table, app, &[]).await;
    assert_eq!(export.code, 2, "no application table: {export:#?}");
    assert!(export.stderr.contains(app), "{export:#?}");
}

async fn live_kcl_workers_refuse_unless_forced(fx: &Fixture, seq: &str) {
    fx.kcl_put(
        &fx.kcl_table,
        KclRow::new(&shard(0), seq, 0).owner("kcl-live").0,
    )
    .await;
    let dynamodb = fx.dynamodb.clone();
    let table = fx.kcl_table.clone();
    let renewing = tokio::spawn(async move {
        loop {
            dynamodb
                .update_item()
                .table_name(&table)
                .key("leaseKey", AttributeValue::S(shard(0)))
                .update_expression("ADD leaseCounter :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .send()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let refused = fx.import(&[]).await;
    assert_eq!(refused.code, 3, "{refused:#?}");
    assert!(
        refused.stderr.contains("a KCL worker is alive") && refused.stderr.contains("kcl-live"),
        "{refused:#?}"
    );
    assert!(!fx.table_exists(&fx.app_table).await, "nothing written");
    let forced = fx.import(&["--force"]).await.ok();
    assert!(forced.stdout.contains("imported 1 shard"), "{forced:#?}");
    renewing.abort();
    assert_eq!(
        fx.app_rows(&fx.app_table).await,
        BTreeMap::from([(shard(0), Some(seq.to_owned()))])
    );
}

async fn live_instances_refuse_import_and_export(fx: &Fixture) {
    let mut sub = fx.subscribe(&fx.app_table, "instance-live").await;
    let seq = fx.put("r-1", 1).await;
    read(
        &mut sub,
        &BTreeSet::from(["r-1".to_owned()]),
        "a live instance",
    )
    .await;
    support::eventually(
        "the checkpoint of r-1",
        Duration::from_secs(10),
        async || fx.app_rows(&fx.app_table).await[&shard(0)].as_deref() == Some(seq.as_str()),
    )
    .await;
    let before = fx.app_rows(&fx.app_table).await;
    let refused = fx.import(&["--force"]).await;
    assert_eq!(refused.code, 3, "{refused:#?}");
    assert!(
        refused
            .stderr
            .contains("instances of the application are live")
            && refused.stderr.contains("instance-live"),
        "{refused:#?}"
    );
    let target = support::unique_name("kcl-target");
    let export = fx
        .kcl("export", &target, &fx.app_table, &["--create"])
        .await;
    assert_eq!(export.code, 3, "{export:#?}");
    assert!(!fx.table_exists(&target).await, "nothing created");
    assert_eq!(fx.app_rows(&fx.app_table).await, before, "nothing written");
    sub.shutdown().await;
}

/// A KCL worker that takes an ownerless lease while the import watches (as one takes the
/// rows of an export at once) is alive: the import refuses and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_taking_an_ownerless_lease_during_the_watch_refuses() {
    support::init_tracing();
    let fx = Fixture::new("kcl-taken", 1).await;
    let seq = fx.put("t-0", 1).await;
    fx.kcl_put(&fx.kcl_table, KclRow::new(&shard(0), &seq, 0).0)
        .await;
    let dynamodb = fx.dynamodb.clone();
    let table = fx.kcl_table.clone();
    let taking = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        loop {
            dynamodb
                .update_item()
                .table_name(&table)
                .key("leaseKey", AttributeValue::S(shard(0)))
                .update_expression("SET leaseOwner = :owner ADD leaseCounter :one")
                .expression_attribute_values(":owner", AttributeValue::S("kcl-taker".into()))
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .send()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let refused = fx.import(&[]).await;
    taking.abort();
    assert_eq!(refused.code, 3, "{refused:#?}");
    assert!(
        refused.stderr.contains("a KCL worker is alive") && refused.stderr.contains("kcl-taker"),
        "{refused:#?}"
    );
    assert!(!fx.table_exists(&fx.app_table).await, "nothing written");
}

/// The application's rows of the stream: shard id → checkpoint, written as an instance
/// would leave them.
async fn app_checkpoints(fx: &Fixture, rows: &[(String, Checkpoint)]) {
    let store = DynamoLeaseStore::new(fx.dynamodb.clone(), &fx.app_table).unwrap();
    store.prepare().await.unwrap();
    for (shard, checkpoint) in rows {
        let mut lease = Lease::new(&fx.stream, shard.clone(), Vec::new());
        lease.checkpoint = Some(checkpoint.clone());
        assert!(store.create(&lease).await.unwrap());
    }
}

/// An export into a KCL table that holds no lease of the stream (an empty one, a
/// multi-stream one of other streams) writes the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_fills_a_kcl_table_without_leases_of_the_stream() {
    support::init_tracing();
    let fx = Fixture::new("kcl-fill", 1).await;
    let seq = fx.put("f-0", 1).await;
    app_checkpoints(&fx, &[(shard(0), Checkpoint::Sequence(seq.clone()))]).await;

    let empty = fx
        .kcl("export", &fx.kcl_table, &fx.app_table, &[])
        .await
        .ok();
    assert!(empty.stdout.contains("exported 1 shard"), "{empty:#?}");
    let items = fx.items(&fx.kcl_table).await;
    assert_eq!(s_of(&items[&shard(0)], "checkpoint"), seq, "{items:?}");

    let others = support::unique_name("kcl-others");
    support::create_table_keyed_by(&fx.dynamodb, &others, "leaseKey").await;
    let other = "123456789012:another-stream:1700000000";
    fx.kcl_put(
        &others,
        KclRow::new(&format!("{other}:{}", shard(0)), "TRIM_HORIZON", 0)
            .v3()
            .multi(other, &shard(0))
            .0,
    )
    .await;
    let multi = fx
        .kcl(
            "export",
            &others,
            &fx.app_table,
            &["--multi-stream", "123456789012:1700000001"],
        )
        .await
        .ok();
    assert!(multi.stdout.contains("exported 1 shard"), "{multi:#?}");
    let key = format!("123456789012:{}:1700000001:{}", fx.stream, shard(0));
    let items = fx.items(&others).await;
    assert_eq!(s_of(&items[&key], "checkpoint"), seq, "{items:?}");
    assert_eq!(items.len(), 2, "the other stream's row kept: {items:?}");
}

/// `--multi-stream` with a creation time other than the one the table's rows of the stream
/// are keyed under (the stream was created again): the rows are written under the new keys,
/// the old rows left as they are, whatever those hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_stream_export_under_another_creation_time_writes_the_new_keys() {
    support::init_tracing();
    let fx = Fixture::new("kcl-epoch", 2).await;
    let (zero, one) = (fx.put("e-0", 1).await, fx.put("e-1", UPPER + 1).await);
    app_checkpoints(
        &fx,
        &[
            (shard(0), Checkpoint::Sequence(zero.clone())),
            (shard(1), Checkpoint::Sequence(one.clone())),
        ],
    )
    .await;
    // Under the old creation time: shard 0 elsewhere, shard 1 where the export would put it.
    let old = format!("123456789012:{}:1600000000", fx.stream);
    for (n, checkpoint) in [(0, "TRIM_HORIZON"), (1, one.as_str())] {
        fx.kcl_put(
            &fx.kcl_table,
            KclRow::new(&format!("{old}:{}", shard(n)), checkpoint, 0)
                .v3()
                .multi(&old, &shard(n))
                .0,
        )
        .await;
    }
    let export = fx
        .kcl(
            "export",
            &fx.kcl_table,
            &fx.app_table,
            &["--multi-stream", "123456789012:1700000000"],
        )
        .await
        .ok();
    assert!(export.stdout.contains("exported 2 shards"), "{export:#?}");
    let items = fx.items(&fx.kcl_table).await;
    assert_eq!(items.len(), 4, "{items:?}");
    let new = format!("123456789012:{}:1700000000", fx.stream);
    for (n, seq) in [(0, &zero), (1, &one)] {
        let item = &items[&format!("{new}:{}", shard(n))];
        assert_eq!(&s_of(item, "checkpoint"), seq, "{item:?}");
        assert_eq!(n_of(item, "leaseCounter"), 0, "a new row: {item:?}");
    }
    assert_eq!(
        s_of(&items[&format!("{old}:{}", shard(0))], "checkpoint"),
        "TRIM_HORIZON"
    );
}

/// A KCL lease of a shard the stream no longer lists (past retention) beside one it lists:
/// the import leaves it as it is, without reading at its checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_leaves_leases_of_unlisted_shards_unread() {
    support::init_tracing();
    let fx = Fixture::new("kcl-unlisted", 1).await;
    let seq = fx.put("u-0", 1).await;
    for n in [0, 99] {
        fx.kcl_put(&fx.kcl_table, KclRow::new(&shard(n), &seq, 0).0)
            .await;
    }
    let import = fx.import(&[]).await.ok();
    for needle in ["imported 1 shard", "no longer lists", &shard(99)] {
        assert!(import.stdout.contains(needle), "{needle}: {import:#?}");
    }
    assert_eq!(
        fx.app_rows(&fx.app_table).await,
        BTreeMap::from([(shard(0), Some(seq))])
    );
}

/// The application's row of the shard was written for an earlier stream of the same name
/// (the stream was deleted and created again, its rows kept): an export writes where the
/// application would read the new shard from (TRIM_HORIZON), not the earlier stream's
/// SHARD_END; an import replaces the row with one of the new shard, holding the KCL's
/// checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_an_earlier_stream_are_neither_exported_nor_kept_by_an_import() {
    support::init_tracing();
    let fx = Fixture::new("kcl-earlier", 1).await;
    let seq = fx.put("e-0", 1).await;
    let store = DynamoLeaseStore::new(fx.dynamodb.clone(), &fx.app_table).unwrap();
    store.prepare().await.unwrap();
    let mut earlier = Lease::new(&fx.stream, shard(0), Vec::new());
    earlier.checkpoint = Some(Checkpoint::ShardEnd);
    earlier.starting_sequence_number = Some("1".to_owned());
    assert!(store.create(&earlier).await.unwrap());

    let export = fx
        .kcl("export", &fx.kcl_table, &fx.app_table, &[])
        .await
        .ok();
    assert!(export.stdout.contains("earlier stream"), "{export:#?}");
    let items = fx.items(&fx.kcl_table).await;
    assert_eq!(
        s_of(&items[&shard(0)], "checkpoint"),
        "TRIM_HORIZON",
        "{items:?}"
    );

    fx.kcl_put(&fx.kcl_table, KclRow::new(&shard(0), &seq, 0).0)
        .await;
    let import = fx.import(&[]).await.ok();
    assert!(import.stdout.contains("earlier stream"), "{import:#?}");
    let row = store
        .list(&fx.stream)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.shard_id == shard(0))
        .unwrap();
    common::assert_row_of_listed_shard(&fx.kinesis, &fx.stream, &shard(0), &row).await;
    assert_eq!(row.checkpoint, Some(Checkpoint::Sequence(seq)), "{row:?}");
}
