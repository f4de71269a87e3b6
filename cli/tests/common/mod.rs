//! Running the built `kinesis-dataflow` binary against the emulators, shared by the CLI's
//! test binaries.

use std::process::Stdio;
use std::time::Duration;

use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::{KinesisPosition, ReadSettings, Subscription, SubscriptionBuilder};
use kinesis_dataflow_test_support as support;
use serde_json::Value;

/// A subscription of `owner` to `stream` that lists, checkpoints and stops quickly, from the
/// oldest record.
#[allow(dead_code, reason = "not every test binary runs subscriptions")]
pub fn quick_subscription(
    api: SharedKinesis,
    store: SharedLeaseStore,
    stream: &str,
    owner: &str,
) -> SubscriptionBuilder {
    Subscription::builder(api, store, stream)
        .owner(owner)
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(100))
                .unlimited_reads(),
        )
        .list_interval(Duration::from_millis(300))
        .lease_duration(Duration::from_secs(3))
        .checkpoint_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(2))
        .initial_position(KinesisPosition::horizon())
}

/// What one run of the tool gave.
#[derive(Debug)]
pub struct Run {
    /// The exit status.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Standard output as one JSON document.
    #[allow(dead_code, reason = "not every test binary reads JSON")]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {self:#?}"))
    }

    /// Asserts exit status 0.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "{self:#?}");
        self
    }
}

/// Runs the tool with the standard AWS environment pointed at the emulators.
pub async fn cli(args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kinesis-dataflow"))
        .args(args)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ENDPOINT_URL_KINESIS", support::kinesis_endpoint())
        .env("AWS_ENDPOINT_URL_DYNAMODB", support::dynamodb_endpoint())
        .env_remove("AWS_PROFILE")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("the tool finishes within 30 s")
        .expect("the tool runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Asserts that `row` was written for the shard `stream` lists as `shard`: it records that
/// shard's starting sequence number (not an earlier stream's of the same name).
#[allow(
    dead_code,
    reason = "not every test binary looks at rows of a stream created again"
)]
pub async fn assert_row_of_listed_shard(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    shard: &str,
    row: &kinesis_dataflow::lease::Lease,
) {
    let listed = support::list_shards(client, stream).await.unwrap();
    let listed = listed.iter().find(|s| s.shard_id() == shard).unwrap();
    assert_eq!(
        row.starting_sequence_number.as_deref(),
        listed
            .sequence_number_range()
            .map(|r| r.starting_sequence_number()),
        "a row of the listed shard {shard}: {row:?}"
    );
}
