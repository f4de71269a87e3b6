//! The consumer example (`examples/consumer.rs`, the built binary) live on the emulators: it
//! lists its shards at once, handles every paid order in per-shard batches of at most 50,
//! reports the record that is not an order, and on Ctrl-C (SIGINT) stops with its checkpoints
//! written; started again, it handles nothing twice.

mod support;

use std::process::Stdio;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

const ORDERS: usize = 130;

fn start(stream: &str, application: &str) -> Child {
    support::examples::command("consumer")
        .args([stream, application])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts")
}

/// Reads the child's stdout until `done` holds for the lines so far (a hang guard of 60 s).
async fn lines_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: &mut Vec<String>,
    done: impl Fn(&[String]) -> bool,
) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done(seen) {
            let line = lines.next_line().await.unwrap().expect("the example runs");
            seen.push(line);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the example's output so far: {seen:#?}"));
}

/// Orders handled, summed over the batch lines.
fn handled(lines: &[String]) -> usize {
    lines
        .iter()
        .filter_map(|l| {
            l.strip_prefix("batch of ")?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

fn interrupt(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_handles_every_paid_order_and_stops_cleanly_on_ctrl_c() {
    let client = support::kinesis_client();
    let stream = support::unique_name("orders");
    support::create_stream(&client, &stream, 2).await;
    let mut paid = 0;
    for i in 0..ORDERS {
        let status = if i % 3 == 0 { "pending" } else { "paid" };
        paid += usize::from(status == "paid");
        let body = format!(
            r#"{{"id":"o-{i}","amount_cents":{},"status":"{status}"}}"#,
            i * 10
        );
        client
            .put_record()
            .stream_name(&stream)
            .partition_key(format!("customer-{}", i % 7))
            .data(Blob::new(body))
            .send()
            .await
            .unwrap();
    }
    client
        .put_record()
        .stream_name(&stream)
        .partition_key("customer-x")
        .data(Blob::new("not json"))
        .send()
        .await
        .unwrap();
    let application = support::unique_name("consumer");

    let mut child = start(&stream, &application);
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    lines_until(&mut lines, &mut seen, |l| handled(l) >= paid).await;
    assert!(
        seen[0].contains("shardId-000000000000") && seen[0].contains("shardId-000000000001"),
        "the shards are listed as soon as it started: {}",
        seen[0]
    );
    for line in seen.iter().filter(|l| l.starts_with("batch of ")) {
        let n = handled(std::slice::from_ref(line));
        assert!((1..=50).contains(&n), "{line}");
    }
    assert_eq!(handled(&seen), paid, "every paid order once: {seen:#?}");
    interrupt(&child);
    lines_until(&mut lines, &mut seen, |l| {
        l.last().is_some_and(|l| l.starts_with("stopped"))
    })
    .await;
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("it exits after Ctrl-C")
        .unwrap();
    let mut errors = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut BufReader::new(stderr), &mut errors)
        .await
        .unwrap();
    assert!(status.success(), "{status}: {errors}");
    let last = seen.last().unwrap();
    assert!(last.contains("checkpoints written"), "{last}");
    assert!(
        errors.contains("not an order"),
        "the bad record is reported: {errors}"
    );

    // Started again, everything is checkpointed: no batch comes.
    let mut again = start(&stream, &application);
    let mut lines = BufReader::new(again.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    lines_until(&mut lines, &mut seen, |l| !l.is_empty()).await;
    let more = tokio::time::timeout(Duration::from_secs(3), lines.next_line()).await;
    assert!(more.is_err(), "nothing handled twice: {more:?}");
    interrupt(&again);
    let status = again.wait().await.unwrap();
    assert!(status.success(), "{status}");
}
