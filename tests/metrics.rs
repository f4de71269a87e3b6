//! The metrics during a real run: the `prometheus` example (the built binary) publishes 60
//! records with the library's publisher and reads them against kinesis-local and dynalite,
//! while this test scrapes its `/metrics` endpoint: every documented name is there with its
//! labels, the counts match what was published and read, and the time behind the tip falls
//! to zero once the stream is drained.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RECORDS: f64 = 60.0;

/// One scrape: every sample line, as (name with labels, value).
async fn scrape(port: u16) -> Option<BTreeMap<String, f64>> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await.ok()?;
    let text = body.split_once("\r\n\r\n")?.1;
    Some(
        text.lines()
            .filter(|l| l.starts_with("kinesis_dataflow_"))
            .filter_map(|l| {
                let (key, value) = l.rsplit_once(' ')?;
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect(),
    )
}

/// The sum of every sample of `name` whose labels include all of `labels`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

fn count(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> usize {
    samples
        .keys()
        .filter(|k| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_during_a_run_shows_every_metric_with_plausible_values() {
    let client = support::kinesis_client();
    let stream = support::unique_name("metrics");
    support::create_stream(&client, &stream, 2).await;
    let application = support::unique_name("metrics-app");
    let port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().port()
    };
    let mut child = support::examples::command("prometheus")
        .args([stream.as_str(), application.as_str(), &port.to_string()])
        .env("PUBLISH", (RECORDS as usize).to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");

    let s = format!("stream=\"{stream}\"");
    let app = format!("application=\"{application}\"");
    let labels = [s.as_str(), app.as_str()];
    let mut last = BTreeMap::new();
    let drained = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(samples) = scrape(port).await {
                let delivered = sum(
                    &samples,
                    "kinesis_dataflow_records_delivered_total",
                    &labels,
                );
                let behind = sum(&samples, "kinesis_dataflow_behind_latest_seconds", &labels);
                let acked = sum(
                    &samples,
                    "kinesis_dataflow_records_settled_total",
                    &[s.as_str(), app.as_str(), "outcome=\"acked\""],
                );
                let checkpoints = sum(
                    &samples,
                    "kinesis_dataflow_checkpoint_writes_total",
                    &[s.as_str(), "outcome=\"ok\""],
                );
                let lag_known =
                    count(&samples, "kinesis_dataflow_behind_latest_seconds", &labels) == 2;
                last = samples;
                if delivered == RECORDS
                    && acked == RECORDS
                    && checkpoints > 0.0
                    && lag_known
                    && behind == 0.0
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "not drained within 60 s; last scrape: {last:#?}"
    );
    let samples = last;

    // Per shard, with the three labels.
    for name in [
        "kinesis_dataflow_records_delivered_total",
        "kinesis_dataflow_bytes_delivered_total",
        "kinesis_dataflow_records_in_flight",
        "kinesis_dataflow_behind_latest_seconds",
        "kinesis_dataflow_checkpoint_age_seconds",
    ] {
        assert_eq!(
            count(
                &samples,
                name,
                &[s.as_str(), app.as_str(), "shard=\"shardId-"]
            ),
            2,
            "{name}: one sample per shard"
        );
    }
    let bytes = sum(&samples, "kinesis_dataflow_bytes_delivered_total", &labels);
    assert!(bytes >= RECORDS * 7.0, "bytes delivered: {bytes}");
    assert_eq!(
        sum(&samples, "kinesis_dataflow_records_in_flight", &labels),
        0.0
    );
    for outcome in [
        "acked",
        "skipped",
        "dropped",
        "abandoned",
        "dead_lettered",
        "retried",
    ] {
        let o = format!("outcome=\"{outcome}\"");
        assert_eq!(
            count(
                &samples,
                "kinesis_dataflow_records_settled_total",
                &[s.as_str(), o.as_str()]
            ),
            2,
            "settled by {outcome}"
        );
    }
    assert_eq!(
        sum(
            &samples,
            "kinesis_dataflow_records_settled_total",
            &[s.as_str(), "outcome=\"skipped\""]
        ),
        0.0
    );
    for outcome in [
        "records",
        "empty",
        "throttled",
        "failed",
        "expired_iterator",
    ] {
        let o = format!("outcome=\"{outcome}\"");
        assert_eq!(
            count(
                &samples,
                "kinesis_dataflow_get_records_total",
                &[s.as_str(), o.as_str()]
            ),
            2,
            "GetRecords by {outcome}"
        );
    }
    assert!(
        sum(
            &samples,
            "kinesis_dataflow_get_records_total",
            &[s.as_str(), "outcome=\"records\""]
        ) >= 2.0
    );
    assert_eq!(
        sum(
            &samples,
            "kinesis_dataflow_get_records_total",
            &[s.as_str(), "outcome=\"failed\""]
        ),
        0.0
    );

    // Per stream: leases.
    assert_eq!(sum(&samples, "kinesis_dataflow_leases_held", &labels), 2.0);
    assert_eq!(
        sum(&samples, "kinesis_dataflow_leases_taken_total", &labels),
        2.0
    );
    assert_eq!(
        sum(&samples, "kinesis_dataflow_leases_lost_total", &labels),
        0.0
    );
    assert_eq!(
        count(
            &samples,
            "kinesis_dataflow_leases_handed_off_total",
            &labels
        ),
        1
    );
    assert_eq!(
        sum(
            &samples,
            "kinesis_dataflow_lease_take_seconds_count",
            &labels
        ),
        2.0
    );

    // The publisher.
    assert_eq!(
        sum(
            &samples,
            "kinesis_dataflow_published_records_total",
            &[s.as_str(), "outcome=\"ok\""]
        ),
        RECORDS
    );
    assert_eq!(
        sum(
            &samples,
            "kinesis_dataflow_published_records_total",
            &[s.as_str(), "outcome=\"failed\""]
        ),
        0.0
    );
    assert_eq!(
        count(
            &samples,
            "kinesis_dataflow_publish_retries_total",
            &[s.as_str()]
        ),
        1
    );
    assert_eq!(
        count(
            &samples,
            "kinesis_dataflow_publish_throttled_total",
            &[s.as_str()]
        ),
        1
    );
    assert!(
        sum(
            &samples,
            "kinesis_dataflow_publish_batch_records_count",
            &[s.as_str()]
        ) >= 1.0
    );

    // A graceful stop: SIGTERM.
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the example stops on SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}
