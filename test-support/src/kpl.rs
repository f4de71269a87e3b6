//! AWS's aggregation library (`aws-kinesis-agg` from npm, pinned in `harness/package.json`) as
//! an independent producer and reader of KPL aggregates, run through `harness/kpl.js`.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::npm::ensure_npm_packages;
use crate::paths::harness_dir;

/// A user record: partition key, explicit hash key, data.
pub type UserRecord = (String, Option<String>, Vec<u8>);

/// A user record as the reference reader returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceUserRecord {
    /// The user record's partition key.
    pub partition_key: String,
    /// The aggregate's sequence number.
    pub sequence_number: String,
    /// Its place in the aggregate.
    pub sub_sequence_number: u64,
    /// Its data.
    pub data: Vec<u8>,
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex from kpl.js"))
        .collect()
}

fn run(command: &str, input: &Value) -> Value {
    ensure_npm_packages().expect("the harness's npm packages");
    let mut child = Command::new("node")
        .arg(harness_dir().join("kpl.js"))
        .arg(command)
        .current_dir(harness_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.to_string().as_bytes())
        .expect("kpl.js reads its input");
    let out = child.wait_with_output().expect("kpl.js ends");
    assert!(
        out.status.success(),
        "kpl.js {command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kpl.js prints JSON")
}

/// Aggregates `records` with the reference library: the Kinesis records to put, each a
/// partition key and data (it splits at the 1 MiB limit by itself).
pub fn reference_aggregate(records: &[UserRecord]) -> Vec<(String, Vec<u8>)> {
    let input: Vec<Value> = records
        .iter()
        .map(|(key, hash_key, data)| {
            let mut record = json!({ "partitionKey": key, "data": hex(data) });
            if let Some(hash_key) = hash_key {
                record["explicitHashKey"] = json!(hash_key);
            }
            record
        })
        .collect();
    run("aggregate", &Value::Array(input))
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            (
                r["partitionKey"].as_str().expect("a key").to_owned(),
                unhex(r["data"].as_str().expect("data")),
            )
        })
        .collect()
}

/// De-aggregates Kinesis records (data, partition key, sequence number) with the reference
/// library, checksums checked.
pub fn reference_deaggregate(records: &[(Vec<u8>, String, String)]) -> Vec<ReferenceUserRecord> {
    let input: Vec<Value> = records
        .iter()
        .map(|(data, key, seq)| json!({ "data": hex(data), "partitionKey": key, "sequenceNumber": seq }))
        .collect();
    run("deaggregate", &Value::Array(input))
        .as_array()
        .expect("an array")
        .iter()
        .map(|u| ReferenceUserRecord {
            partition_key: u["partitionKey"].as_str().expect("a key").to_owned(),
            sequence_number: u["sequenceNumber"].as_str().expect("a sequence").to_owned(),
            sub_sequence_number: u["subSequenceNumber"].as_u64().expect("a sub-sequence"),
            data: unhex(u["data"].as_str().expect("data")),
        })
        .collect()
}
