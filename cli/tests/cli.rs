//! The `kinesis-dataflow` command-line tool (the built binary, configured only by the standard
//! AWS environment) against kinesis-local and dynalite, with real subscriptions making the
//! rows: `status` and `workers` on a running instance, `reset` dry-run, refused, forced while
//! running, on stopped instances, and after the stream was deleted and created again (the old
//! rows replaced); every kind of bad input refused with a clear message, a non-zero exit and
//! nothing written.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use common::{Run, cli};
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::lease::{Lease, SharedLeaseStore};
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, Subscription, SubscriptionBuilder};
use kinesis_dataflow_test_support as support;
use serde_json::Value;

mod common;

struct App {
    api: SharedKinesis,
    client: aws_sdk_kinesis::Client,
    store: SharedLeaseStore,
    table: String,
    stream: String,
}

impl App {
    async fn new(prefix: &str, shards: i32) -> Self {
        let client = support::kinesis_client();
        let stream = support::unique_name(prefix);
        let table = support::unique_name(&format!("{prefix}-leases"));
        support::create_stream(&client, &stream, shards).await;
        Self {
            api: Arc::new(AwsKinesis::new(client.clone())),
            store: Arc::new(DynamoLeaseStore::new(support::dynamodb_client(), &table).unwrap()),
            client,
            table,
            stream,
        }
    }

    fn builder(&self, owner: &str) -> SubscriptionBuilder {
        common::quick_subscription(self.api.clone(), self.store.clone(), &self.stream, owner)
    }

    /// Puts `tag-0..count` one by one (keys spread over the shards); their sequence numbers.
    async fn put(&self, tag: &str, count: usize) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for i in 0..count {
            let data = format!("{tag}-{i:02}");
            let put = self
                .client
                .put_record()
                .stream_name(&self.stream)
                .partition_key(format!("key-{i}"))
                .data(Blob::new(data.clone()))
                .send()
                .await
                .unwrap();
            out.push((data, put.sequence_number().to_owned()));
        }
        out
    }

    /// `<command> --table T --stream S <extra>`.
    async fn run(&self, command: &str, extra: &[&str]) -> Run {
        let mut args = vec![command, "--table", &self.table, "--stream", &self.stream];
        args.extend_from_slice(extra);
        cli(&args).await
    }

    /// Deletes the stream and creates it again under the same name, with as many shards: the
    /// rows of the old stream's shards stay in the lease table.
    async fn create_again(&self, shards: i32) {
        self.client
            .delete_stream()
            .stream_name(&self.stream)
            .send()
            .await
            .unwrap();
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            while self
                .client
                .describe_stream_summary()
                .stream_name(&self.stream)
                .send()
                .await
                .is_ok()
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the stream was never deleted");
        // kinesis-local derives a shard's starting sequence number from the second its stream
        // was created (AWS takes seconds to delete and create a stream anyway).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        support::create_stream(&self.client, &self.stream, shards).await;
    }

    async fn status(&self) -> Value {
        self.run("status", &["--json"]).await.ok().json()
    }

    /// Polls `status --json` until `done` holds (15 s at most).
    async fn status_until(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let reached = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                last = self.status().await;
                if done(&last) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        assert!(reached.is_ok(), "{what}; the last status: {last:#}");
        last
    }

    async fn rows(&self) -> Vec<Lease> {
        self.store.list(&self.stream).await.unwrap()
    }

    /// The checkpoints of the shard rows, encoded.
    async fn checkpoints(&self) -> Vec<(String, Option<String>)> {
        self.rows()
            .await
            .into_iter()
            .filter(|r| !r.shard_id.starts_with("worker:"))
            .map(|r| (r.shard_id, r.checkpoint.map(|c| c.encode())))
            .collect()
    }
}

fn shards(status: &Value) -> &Vec<Value> {
    status["shards"].as_array().expect("shards")
}

fn payloads(records: &[(String, String)]) -> BTreeSet<String> {
    records.iter().map(|(p, _)| p.clone()).collect()
}

async fn read_all(sub: &mut Subscription, expected: &BTreeSet<String>, what: &str) -> Vec<String> {
    support::read_until(sub, expected, what, Duration::from_secs(20))
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect()
}

/// Every shard owned by `owner`, with a sequence checkpoint and nothing behind.
fn caught_up(status: &Value, owner: &str) -> bool {
    shards(status).iter().all(|s| {
        s["row"]["owner"] == owner
            && s["row"]["checkpoint_kind"] == "sequence"
            && s["lag"]["records_behind"] == 0
            && s["lag"]["records_behind_exact"] == true
            && s["lag"]["millis_behind"] == 0
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_workers_follow_a_running_subscription() {
    support::init_tracing();
    let app = App::new("cli-status", 2).await;
    let mut sub = app.builder("instance-a").start().await.unwrap();
    let records = app.put("status", 30).await;

    // Held, nothing settled yet: every record is behind, counted exactly.
    status_counts_every_record_behind(&app, "instance-a", 30).await;
    workers_show_the_instance_active(&app, "instance-a").await;

    // Drained: the lag falls to zero.
    read_all(&mut sub, &payloads(&records), "the first records").await;
    app.status_until("caught up after the drain", |s| caught_up(s, "instance-a"))
        .await;
    watch_prints_rounds_with_the_counters_movement(&app).await;

    // Stopped gracefully: no instance, no owner.
    sub.shutdown().await;
    nothing_is_held_after_a_graceful_stop(&app).await;
}

/// `status` once `owner` holds both leases of a two-shard stream and has settled none of the
/// `put` records: each shard open, its lease fresh, every record behind (counted exactly); the
/// table form names the columns, the owner and the shards.
async fn status_counts_every_record_behind(app: &App, owner: &str, put: u64) {
    let status = app
        .status_until("both leases held", |s| {
            shards(s).iter().all(|s| s["row"]["owner"] == owner)
        })
        .await;
    assert_eq!(status["stream"], app.stream.as_str());
    assert_eq!(status["table"], app.table.as_str());
    assert_eq!(shards(&status).len(), 2);
    let behind: u64 = shards(&status)
        .iter()
        .map(|s| {
            assert_eq!(s["state"], "open");
            assert_eq!(s["lag"]["records_behind_exact"], true, "{s:#}");
            assert!(s["row"]["counter"].as_u64().unwrap() > 0, "{s:#}");
            assert!(s["row"]["age_ms"].as_u64().unwrap() < 10_000, "{s:#}");
            s["lag"]["records_behind"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(behind, put, "{status:#}");

    let table = app.run("status", &[]).await.ok().stdout;
    for needle in [
        "SHARD",
        "BEHIND",
        "RECORDS",
        owner,
        "shardId-000000000000",
        "shardId-000000000001",
        "from TRIM_HORIZON",
    ] {
        assert!(table.contains(needle), "{needle} in:\n{table}");
    }
}

/// `workers`, JSON and table: `owner` alone, active, seen lately, holding both leases.
async fn workers_show_the_instance_active(app: &App, owner: &str) {
    let workers = app.run("workers", &["--json"]).await.ok().json();
    let list = workers["workers"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{workers:#}");
    assert_eq!(list[0]["owner"], owner);
    assert_eq!(list[0]["state"], "active");
    assert_eq!(list[0]["leases"], 2);
    assert!(list[0]["last_seen_ms_ago"].as_u64().unwrap() < 10_000);
    let text = app.run("workers", &[]).await.ok().stdout;
    assert!(
        text.contains(owner) && text.contains("active") && text.contains("LAST SEEN"),
        "{text}"
    );
}

/// `status --watch`: two rounds and no third, with the counters' movement (renewals) from the
/// second on; under `--json`, one document a line, the first without movement.
async fn watch_prints_rounds_with_the_counters_movement(app: &App) {
    let watched = app
        .run("status", &["--watch", "1.2", "--watch-count", "2"])
        .await
        .ok()
        .stdout;
    assert!(
        watched.contains("--- round 1 ---") && watched.contains("--- round 2 ---"),
        "{watched}"
    );
    assert!(!watched.contains("--- round 3 ---"), "{watched}");
    assert!(
        watched.contains("(+"),
        "counter movement in round 2:\n{watched}"
    );
    let lines = app
        .run(
            "status",
            &["--json", "--watch", "1.2", "--watch-count", "2"],
        )
        .await
        .ok()
        .stdout;
    let docs: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{lines}");
    assert!(
        shards(&docs[0])
            .iter()
            .all(|s| s["counter_delta"].is_null())
    );
    assert!(
        shards(&docs[1])
            .iter()
            .all(|s| s["counter_delta"].as_u64().unwrap() > 0),
        "leases renewed every second: {:#}",
        docs[1]
    );
}

/// After a graceful stop: no instance in `workers`, no owner in `status`.
async fn nothing_is_held_after_a_graceful_stop(app: &App) {
    let workers = app.run("workers", &["--json"]).await.ok().json();
    assert_eq!(workers["workers"], Value::Array(vec![]), "{workers:#}");
    let text = app.run("workers", &[]).await.ok().stdout;
    assert!(text.contains("no instances"), "{text}");
    let status = app.status().await;
    assert!(
        shards(&status).iter().all(|s| s["row"]["owner"].is_null()),
        "{status:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_refused_while_held_dry_run_and_stopped_instances_moved() {
    support::init_tracing();
    let app = App::new("cli-reset", 1).await;
    let mut sub = app.builder("instance-b").start().await.unwrap();
    let first = app.put("first", 5).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let between = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = app.put("second", 5).await;
    let mut all = payloads(&first);
    all.extend(payloads(&second));
    read_all(&mut sub, &all, "every record").await;
    app.status_until("caught up", |s| caught_up(s, "instance-b"))
        .await;

    // Held by a live instance: refused, exit 3, nothing written.
    refused_while_held(&app, "instance-b").await;
    sub.shutdown().await;
    // Stopped: a dry run writes nothing at all (counters included).
    dry_run_writes_nothing(&app).await;
    // To a sequence number: the instance started again reads from that record on.
    reset_to_a_sequence_number(&app, "instance-b2", &second, 2).await;
    // To a timestamp (RFC 3339) between the two batches: the second batch again, not the first.
    reset_to_a_timestamp(&app, "instance-b3", between, &payloads(&second)).await;
}

/// `reset --to horizon` while `owner` holds the lease: the plan printed, then refused (exit 3,
/// naming the owner and --force); `--dry-run` says it would be refused; nothing written, no
/// lease taken.
async fn refused_while_held(app: &App, owner: &str) {
    let settled = app.checkpoints().await;
    let refused = app.run("reset", &["--to", "horizon"]).await;
    assert_eq!(refused.code, 3, "{refused:#?}");
    assert!(
        refused.stderr.contains(&format!("`{owner}`")) && refused.stderr.contains("--force"),
        "{refused:#?}"
    );
    assert!(
        refused.stdout.contains("shardId-000000000000")
            && refused.stdout.contains("from TRIM_HORIZON"),
        "the plan is shown first: {refused:#?}"
    );
    let dry = app
        .run("reset", &["--to", "horizon", "--dry-run"])
        .await
        .ok();
    assert!(dry.stdout.contains("would be refused"), "{dry:#?}");
    // Under --json the refusal is the document's outcome, with the same exit status.
    let refused = app.run("reset", &["--to", "horizon", "--json"]).await;
    assert_eq!(refused.code, 3, "{refused:#?}");
    let doc = refused.json();
    assert_eq!(doc["outcome"], "refused", "{doc:#}");
    assert_eq!(doc["applied"], false, "{doc:#}");
    assert_eq!(doc["exit_status"], 3, "{doc:#}");
    assert_eq!(doc["written"], serde_json::json!([]), "{doc:#}");
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains(&format!("`{owner}`")),
        "{doc:#}"
    );
    assert_eq!(doc["shards"][0]["written"], false, "{doc:#}");
    assert_eq!(app.checkpoints().await, settled);
    assert!(
        app.rows().await.iter().all(|r| !r
            .owner
            .as_deref()
            .unwrap_or("")
            .starts_with("kinesis-dataflow-reset")),
        "the tool took no lease"
    );
}

/// `reset --dry-run --json` with the instances stopped: not refused, the change planned, no
/// row touched.
async fn dry_run_writes_nothing(app: &App) {
    let before = app.rows().await;
    let plan = app
        .run("reset", &["--to", "horizon", "--dry-run", "--json"])
        .await
        .ok()
        .json();
    assert!(plan["refused"].is_null(), "{plan:#}");
    assert_eq!(plan["shards"][0]["to"], "TRIM_HORIZON");
    assert_eq!(plan["shards"][0]["changed"], true);
    assert_eq!(plan["outcome"], "dry_run", "{plan:#}");
    assert_eq!(plan["applied"], false, "{plan:#}");
    assert_eq!(plan["exit_status"], 0, "{plan:#}");
    assert_eq!(plan["shards"][0]["written"], false, "{plan:#}");
    assert_eq!(app.rows().await, before, "a dry run writes nothing");
}

/// `reset --to sequence:<the sequence number of records[from]>` of the one shard: the
/// checkpoint and lag say so, and `owner` started afterwards reads from that record on.
async fn reset_to_a_sequence_number(
    app: &App,
    owner: &str,
    records: &[(String, String)],
    from: usize,
) {
    let (payload, seq) = records[from].clone();
    let moved = app
        .run(
            "reset",
            &[
                "--to",
                &format!("sequence:{seq}"),
                "--shard",
                "shardId-000000000000",
            ],
        )
        .await
        .ok();
    assert!(moved.stdout.contains("reset 1 shard of"), "{moved:#?}");
    let status = app.status().await;
    assert_eq!(
        shards(&status)[0]["row"]["checkpoint"],
        format!("AT_SEQUENCE_NUMBER:{seq}").as_str()
    );
    assert_eq!(
        shards(&status)[0]["lag"]["records_behind"],
        records.len() - from
    );
    let mut sub = app.builder(owner).start().await.unwrap();
    let expected = payloads(&records[from..]);
    let got = read_all(&mut sub, &expected, "from the sequence number").await;
    assert_eq!(got.first(), Some(&payload), "{got:?}");
    assert!(
        got.iter().all(|p| expected.contains(p)),
        "nothing before the sequence number: {got:?}"
    );
    sub.shutdown().await;
}

/// `reset --to timestamp:<at, RFC 3339>`: `owner` started afterwards reads `expected` (what
/// arrived after `at`) and nothing before.
async fn reset_to_a_timestamp(
    app: &App,
    owner: &str,
    at: jiff::Timestamp,
    expected: &BTreeSet<String>,
) {
    let at_ms = at.as_millisecond();
    let at = format!("{at:.3}");
    let done = app
        .run("reset", &["--to", &format!("timestamp:{at}"), "--json"])
        .await
        .ok()
        .json();
    // One document, printed once the reset is done: what was written, and no failure.
    assert_eq!(done["outcome"], "applied", "{done:#}");
    assert_eq!(done["applied"], true, "{done:#}");
    assert_eq!(done["exit_status"], 0, "{done:#}");
    assert_eq!(done["written"], serde_json::json!(["shardId-000000000000"]));
    assert_eq!(done["failures"], serde_json::json!([]), "{done:#}");
    assert!(done["error"].is_null(), "{done:#}");
    assert_eq!(done["shards"][0]["written"], true, "{done:#}");
    assert_eq!(
        done["shards"][0]["to"],
        format!("AT_TIMESTAMP:{at_ms}").as_str(),
        "{done:#}"
    );
    let mut sub = app.builder(owner).start().await.unwrap();
    let got = read_all(&mut sub, expected, "from the timestamp").await;
    assert!(
        got.iter().all(|p| expected.contains(p)),
        "nothing before {at}: {got:?}"
    );
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_with_force_while_running_makes_the_instance_read_again_from_the_horizon() {
    support::init_tracing();
    let app = App::new("cli-force", 2).await;
    let mut sub = app.builder("instance-c").start().await.unwrap();
    let records = app.put("force", 20).await;
    let expected = payloads(&records);
    read_all(&mut sub, &expected, "the records").await;
    app.status_until("caught up", |s| caught_up(s, "instance-c"))
        .await;

    let began = std::time::Instant::now();
    let lease = format!("{}", support::timings::LEASE_DURATION.as_secs_f64());
    let forced = app
        .run(
            "reset",
            &["--to", "horizon", "--force", "--lease-duration", &lease],
        )
        .await
        .ok();
    let reset_took = began.elapsed();
    assert!(
        forced.stdout.contains("instance-c (live)")
            && forced.stdout.contains("reset 2 shards")
            && forced
                .stdout
                .contains("holding the leases taken from instances"),
        "{forced:#?}"
    );
    // The running instance lost the leases, took them again and reads everything again: its
    // own checkpoint writes could not overwrite the reset.
    read_all(&mut sub, &expected, "the records again after the reset").await;
    eprintln!(
        "forced reset with {lease} s leases: the tool took {reset_took:?}, every record read \
         again {:?} after it began",
        began.elapsed()
    );
    app.status_until("held and caught up again", |s| caught_up(s, "instance-c"))
        .await;
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_to_the_horizon_reads_a_split_stream_again_parents_first() {
    support::init_tracing();
    let app = App::new("cli-tree", 1).await;
    let all = split_and_put(&app).await;
    let mut sub = app.builder("instance-e").start().await.unwrap();
    read_all(&mut sub, &all, "the whole tree").await;
    let status = app
        .status_until("the parent finished, the children caught up", |s| {
            shards(s).len() == 3
                && shards(s).iter().all(|s| {
                    s["lag"]["records_behind"] == 0
                        && (s["finished"] == true || s["row"]["checkpoint_kind"] == "sequence")
                })
        })
        .await;
    // The parent alone while the children are held: refused (the instance would read the
    // children on while the parent is read again), nothing written.
    parent_alone_refused_while_children_held(&app, "instance-e").await;
    sub.shutdown().await;
    status_shows_the_tree(&app, &status).await;
    // Only the parent: the plan says the children keep their checkpoints.
    parent_alone_plan_names_the_children(&app).await;

    // The whole tree: read again, the parent's records before any child's.
    let reset = app.run("reset", &["--to", "horizon"]).await.ok();
    assert!(reset.stdout.contains("reset 3 shards"), "{reset:#?}");
    let mut sub = app.builder("instance-e2").start().await.unwrap();
    let got = read_all(&mut sub, &all, "the whole tree again").await;
    sub.shutdown().await;
    let last_parent = got.iter().rposition(|p| p.starts_with("parent-")).unwrap();
    let first_child = got.iter().position(|p| p.starts_with("child-")).unwrap();
    assert!(last_parent < first_child, "parents first: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_the_stream_was_created_again_applies_to_the_new_stream() {
    support::init_tracing();
    let app = App::new("cli-again", 1).await;
    // The first stream, read and settled by an instance that then stops: its row stays.
    let old = app.put("old", 3).await;
    let mut sub = app.builder("instance-g").start().await.unwrap();
    read_all(&mut sub, &payloads(&old), "the first stream").await;
    app.status_until("caught up", |s| caught_up(s, "instance-g"))
        .await;
    sub.shutdown().await;

    app.create_again(1).await;
    let before = app.put("before", 3).await;
    // `status` tells the earlier stream's row apart: its checkpoint is not this stream's, and
    // the lag counts from the shard's beginning, where an instance would read it.
    let status = app.status().await;
    let shard = &shards(&status)[0];
    assert_eq!(shard["earlier_stream_row"], true, "{status:#}");
    assert_eq!(shard["lag"]["records_behind"], 3, "{status:#}");
    let table = app.run("status", &[]).await.ok().stdout;
    assert!(
        table.contains("earlier stream's row") && table.contains("earlier stream of the same name"),
        "{table}"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let between = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = payloads(&app.put("after", 3).await);
    let to = format!("timestamp:{between:.3}");
    let dry = app
        .run("reset", &["--to", &to, "--dry-run", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(dry["shards"][0]["earlier_stream_row"], true, "{dry:#}");
    assert_eq!(dry["shards"][0]["changed"], true, "{dry:#}");
    assert_eq!(dry["outcome"], "dry_run", "{dry:#}");
    let reset = app.run("reset", &["--to", &to]).await.ok();
    assert!(
        reset.stdout.contains("earlier stream of the same name")
            && reset.stdout.contains("reset 1 shard"),
        "{reset:#?}"
    );
    let rows = app.rows().await;
    let shard = "shardId-000000000000";
    let row = rows.iter().find(|r| r.shard_id == shard).unwrap();
    common::assert_row_of_listed_shard(&app.client, &app.stream, shard, row).await;

    // The application started again reads the new stream from the reset position: what came
    // after the timestamp, nothing from before it.
    let mut sub = app.builder("instance-g2").start().await.unwrap();
    let got = read_all(&mut sub, &after, "the new stream from the timestamp").await;
    sub.shutdown().await;
    assert!(
        got.iter().all(|p| after.contains(p)),
        "nothing from before the timestamp ({before:?}): {got:?}"
    );
}

/// Five records `parent-*` in the one shard, a split into two children, then ten records
/// `child-*`: every payload.
async fn split_and_put(app: &App) -> BTreeSet<String> {
    let before_split = app.put("parent", 5).await;
    AwsKinesis::new(app.client.clone())
        .split_shard(
            &app.stream,
            "shardId-000000000000",
            &(u128::MAX / 2).to_string(),
        )
        .await
        .unwrap();
    support::wait_active(&app.client, &app.stream).await;
    let after_split = app.put("child", 10).await;
    let mut all = payloads(&before_split);
    all.extend(payloads(&after_split));
    all
}

/// `reset --shard <the parent>` while `owner` holds the children: refused (exit 2), naming the
/// children and their holder.
async fn parent_alone_refused_while_children_held(app: &App, owner: &str) {
    let refused = app
        .run(
            "reset",
            &["--to", "horizon", "--shard", "shardId-000000000000"],
        )
        .await;
    assert_eq!(refused.code, 2, "{refused:#?}");
    assert!(
        refused.stderr.contains("descendants")
            && refused.stderr.contains(&format!("held by `{owner}`"))
            && refused.stderr.contains("shardId-000000000001"),
        "{refused:#?}"
    );
}

/// `status` of the split stream: the closed, finished parent with its two children under it.
async fn status_shows_the_tree(app: &App, status: &Value) {
    let parent = &shards(status)[0];
    assert_eq!(parent["shard_id"], "shardId-000000000000");
    assert_eq!(parent["state"], "closed");
    assert_eq!(parent["finished"], true);
    assert_eq!(parent["children"].as_array().unwrap().len(), 2);
    for child in &shards(status)[1..] {
        assert_eq!(child["depth"], 1);
        assert_eq!(child["parents"][0], "shardId-000000000000");
        assert_eq!(child["state"], "open");
    }
    let table = app.run("status", &[]).await.ok().stdout;
    assert!(
        table.contains("└ shardId-000000000001") && table.contains("SHARD_END"),
        "{table}"
    );
}

/// A dry run of the parent alone, the instances stopped: the plan notes that the children,
/// not reset, wait for it.
async fn parent_alone_plan_names_the_children(app: &App) {
    let parent_only = app
        .run(
            "reset",
            &[
                "--to",
                "horizon",
                "--shard",
                "shardId-000000000000",
                "--dry-run",
            ],
        )
        .await
        .ok();
    assert!(
        parent_only.stdout.contains("is finished and is read again")
            && parent_only
                .stdout
                .contains("shardId-000000000001, shardId-000000000002"),
        "{parent_only:#?}"
    );
}

/// Command lines the tool refuses with exit status 2, writing nothing, and what each message
/// must hold. Words are split on spaces; `{table}`, `{stream}`, `{other}` (a table of another
/// schema), `{missing_table}`, `{missing_stream}` and `{spaced}` (`a b`) stand for names.
const BAD_INPUTS: &[(&str, &[&str])] = &[
    (
        "status --table {missing_table} --stream {stream}",
        &["{missing_table}", "does not exist", "never creates"],
    ),
    (
        "reset --table {missing_table} --stream {stream} --to horizon",
        &["{missing_table}", "does not exist"],
    ),
    (
        "workers --table {other} --stream {stream}",
        &["{other}", "leaseKey"],
    ),
    (
        "status --table {table} --stream {missing_stream}",
        &["{missing_stream}", "does not exist"],
    ),
    (
        "workers --table {table} --stream {missing_stream}",
        &["{missing_stream}", "does not exist"],
    ),
    (
        "reset --table {table} --stream {missing_stream} --to latest",
        &["{missing_stream}", "does not exist"],
    ),
    (
        "reset --table {table} --stream {stream} --to horizon --shard shardId-000000000099",
        &["`shardId-000000000099`", "shardId-000000000000"],
    ),
    (
        "reset --table {table} --stream {stream} --to timestamp:2999-01-01T00:00:00Z",
        &["2999-01-01T00:00:00.000Z", "in the future"],
    ),
    (
        "reset --table {table} --stream {stream} --to timestamp:1796176860",
        &["looks like seconds", "timestamp:1796176860000"],
    ),
    (
        "reset --table {table} --stream {stream} --to sideways",
        &["`sideways`", "horizon, latest"],
    ),
    (
        "reset --table {table} --stream {stream} --to timestamp:noon",
        &["`noon`"],
    ),
    (
        "reset --table {table} --stream {stream} --to sequence:12x --shard shardId-000000000000",
        &["`sequence:12x`"],
    ),
    (
        "reset --table {table} --stream {stream} --to sequence:1 --shard shardId-000000000000",
        &["sequence:1", "not a record of shard `shardId-000000000000`"],
    ),
    (
        "reset --table {table} --stream {stream} --to sequence:1",
        &["exactly one --shard"],
    ),
    (
        "reset --table {table} --stream {stream} --to horizon --lease-duration 0",
        &["--lease-duration", "`0`"],
    ),
    ("reset --table {table} --stream {stream}", &["--to"]),
    ("status --table {table}", &["--stream"]),
    ("workers --table {table}", &["--stream"]),
    ("status --stream {stream}", &["--table", "--application"]),
    ("frobnicate --table {table}", &["'frobnicate'"]),
    (
        "status --table {table} --stream {stream} --colour",
        &["'--colour'"],
    ),
    (
        "status --table {table} --stream {stream} --watch never",
        &["`never`"],
    ),
    ("status --table {spaced} --stream {stream}", &["\"a b\""]),
    (
        "status --table {table} --stream {spaced}",
        &["letters, digits"],
    ),
    (
        "workers --table {table} --stream {spaced}",
        &["letters, digits"],
    ),
    (
        "reset --table {table} --stream {spaced} --to horizon",
        &["letters, digits"],
    ),
    ("", &["no command"]),
];

/// The names [`BAD_INPUTS`] stand for.
struct Names {
    table: String,
    stream: String,
    other: String,
    missing_table: String,
    missing_stream: String,
}

impl Names {
    /// The application's table and stream, a new table of another schema, and a table and a
    /// stream that do not exist.
    async fn new(app: &App) -> Self {
        let other = support::unique_name("cli-other-schema");
        support::create_table_keyed_by(&support::dynamodb_client(), &other, "id").await;
        Self {
            table: app.table.clone(),
            stream: app.stream.clone(),
            other,
            missing_table: support::unique_name("cli-no-such-table"),
            missing_stream: support::unique_name("cli-no-such-stream"),
        }
    }

    /// `text` with the names put in.
    fn expand(&self, text: &str) -> String {
        text.replace("{table}", &self.table)
            .replace("{stream}", &self.stream)
            .replace("{other}", &self.other)
            .replace("{missing_table}", &self.missing_table)
            .replace("{missing_stream}", &self.missing_stream)
            .replace("{spaced}", "a b")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_message_and_nothing_written() {
    support::init_tracing();
    let app = App::new("cli-bad", 1).await;
    let mut sub = app.builder("instance-d").start().await.unwrap();
    let records = app.put("bad", 3).await;
    read_all(&mut sub, &payloads(&records), "the records").await;
    sub.shutdown().await;
    let before = app.rows().await;

    let names = Names::new(&app).await;
    for (line, needles) in BAD_INPUTS {
        let args: Vec<String> = line.split_whitespace().map(|w| names.expand(w)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = cli(&args).await;
        assert_eq!(run.code, 2, "{args:?}: {run:#?}");
        for needle in needles.iter().map(|n| names.expand(n)) {
            assert!(
                run.stderr.contains(&needle),
                "{args:?}: `{needle}` in {run:#?}"
            );
        }
        assert!(
            !run.stdout.contains("reset 1 shard of"),
            "{args:?}: nothing done: {run:#?}"
        );
    }
    assert_eq!(app.rows().await, before, "nothing written");
    let described = support::dynamodb_client()
        .describe_table()
        .table_name(&names.missing_table)
        .send()
        .await;
    assert!(described.is_err(), "the missing table was not created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_names_the_default_table_and_help_is_printed() {
    // --application names the default table.
    let by_app = cli(&[
        "workers",
        "--application",
        "no-such-app-xyz",
        "--stream",
        "s",
    ])
    .await;
    assert_eq!(by_app.code, 2);
    assert!(
        by_app.stderr.contains("`kinesis-dataflow-no-such-app-xyz`"),
        "{by_app:#?}"
    );
    // Help for the tool and each command, on standard output with exit status 0.
    for (args, needle) in [
        (vec!["--help"], "Usage: kinesis-dataflow <COMMAND>"),
        (vec!["status", "--help"], "Usage: kinesis-dataflow status"),
        (vec!["workers", "-h"], "Usage: kinesis-dataflow workers"),
        (
            vec!["reset", "--to", "x", "--help"],
            "Usage: kinesis-dataflow reset",
        ),
    ] {
        let run = cli(&args).await.ok();
        assert!(run.stdout.contains(needle), "{args:?}: {run:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_credentials_and_unknown_options_are_said_once_and_clearly() {
    // No credentials anywhere: the environment has none, no profile, no metadata service.
    let empty_home = support::logs_dir().join("cli-no-credentials-home");
    std::fs::create_dir_all(&empty_home).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kinesis-dataflow"))
        .args(["status", "--table", "t", "--stream", "s"])
        .env_clear()
        .env("AWS_REGION", "us-east-1")
        .env("HOME", &empty_home)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ENDPOINT_URL_DYNAMODB", support::dynamodb_endpoint())
        .env("AWS_ENDPOINT_URL_KINESIS", support::kinesis_endpoint())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("the tool finishes")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no credentials found"), "{stderr}");
    assert!(
        !stderr.contains("IMDS"),
        "no word of the metadata service: {stderr}"
    );

    let run = cli(&["reset", "--nope"]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert_eq!(run.stderr.matches("--help").count(), 1, "{run:#?}");
}

/// An endpoint that accepts connections and never answers (a half-open connection, a stuck
/// proxy) does not hang the tool: its calls are bounded, and it fails with exit status 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_answers_fails_the_command_instead_of_hanging() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kinesis-dataflow"))
        .args(["status", "--table", "any-table", "--stream", "any-stream"])
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ENDPOINT_URL_KINESIS", format!("http://{address}"))
        .env("AWS_ENDPOINT_URL_DYNAMODB", format!("http://{address}"))
        .env_remove("AWS_PROFILE")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the tool gives up on the silent endpoint")
        .expect("the tool runs");
    held.abort();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("any-table"), "{stderr}");
}
