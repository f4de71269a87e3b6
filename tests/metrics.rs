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

/// The `prometheus` example on `stream`, publishing [`RECORDS`] records and serving its
/// metrics on `port`.
fn start_example(stream: &str, application: &str, port: u16) -> tokio::process::Child {
    support::examples::command("prometheus")
        .args([stream, application, &port.to_string()])
        .env("PUBLISH", (RECORDS as usize).to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts")
}

/// The run's labels: `stream="…"` and `application="…"`.
struct Labels {
    s: String,
    app: String,
}

impl Labels {
    fn new(stream: &str, application: &str) -> Self {
        Self {
            s: format!("stream=\"{stream}\""),
            app: format!("application=\"{application}\""),
        }
    }

    fn both(&self) -> [&str; 2] {
        [self.s.as_str(), self.app.as_str()]
    }
}

/// Whether the run is drained: every record delivered and acked, a checkpoint written, and
/// both shards' time behind the tip known and zero.
fn is_drained(samples: &BTreeMap<String, f64>, l: &Labels) -> bool {
    let (s, app, labels) = (&l.s, &l.app, l.both());
    let delivered = sum(samples, "kinesis_dataflow_records_delivered_total", &labels);
    let behind = sum(samples, "kinesis_dataflow_behind_latest_seconds", &labels);
    let acked = sum(
        samples,
        "kinesis_dataflow_records_settled_total",
        &[s.as_str(), app.as_str(), "outcome=\"acked\""],
    );
    let checkpoints = sum(
        samples,
        "kinesis_dataflow_checkpoint_writes_total",
        &[s.as_str(), "outcome=\"ok\""],
    );
    let lag_known = count(samples, "kinesis_dataflow_behind_latest_seconds", &labels) == 2;
    delivered == RECORDS && acked == RECORDS && checkpoints > 0.0 && lag_known && behind == 0.0
}

/// Scrapes every 200 ms until the run is drained (within 60 s); returns that last scrape.
async fn scrape_until_drained(port: u16, labels: &Labels) -> BTreeMap<String, f64> {
    let mut last = BTreeMap::new();
    let drained = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(samples) = scrape(port).await {
                let done = is_drained(&samples, labels);
                last = samples;
                if done {
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
    last
}

/// Per shard, with the three labels; nothing in flight.
fn check_the_per_shard_metrics(samples: &BTreeMap<String, f64>, l: &Labels) {
    let (s, app, labels) = (&l.s, &l.app, l.both());
    for name in [
        "kinesis_dataflow_records_delivered_total",
        "kinesis_dataflow_bytes_delivered_total",
        "kinesis_dataflow_records_in_flight",
        "kinesis_dataflow_behind_latest_seconds",
        "kinesis_dataflow_checkpoint_age_seconds",
    ] {
        assert_eq!(
            count(
                samples,
                name,
                &[s.as_str(), app.as_str(), "shard=\"shardId-"]
            ),
            2,
            "{name}: one sample per shard"
        );
    }
    let bytes = sum(samples, "kinesis_dataflow_bytes_delivered_total", &labels);
    assert!(bytes >= RECORDS * 7.0, "bytes delivered: {bytes}");
    assert_eq!(
        sum(samples, "kinesis_dataflow_records_in_flight", &labels),
        0.0
    );
}

/// Settlement by every outcome, none skipped.
fn check_the_settlement_metrics(samples: &BTreeMap<String, f64>, s: &str) {
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
                samples,
                "kinesis_dataflow_records_settled_total",
                &[s, o.as_str()]
            ),
            2,
            "settled by {outcome}"
        );
    }
    assert_eq!(
        sum(
            samples,
            "kinesis_dataflow_records_settled_total",
            &[s, "outcome=\"skipped\""]
        ),
        0.0
    );
}

/// GetRecords by every outcome, some with records, none failed.
fn check_the_get_records_metrics(samples: &BTreeMap<String, f64>, s: &str) {
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
                samples,
                "kinesis_dataflow_get_records_total",
                &[s, o.as_str()]
            ),
            2,
            "GetRecords by {outcome}"
        );
    }
    assert!(
        sum(
            samples,
            "kinesis_dataflow_get_records_total",
            &[s, "outcome=\"records\""]
        ) >= 2.0
    );
    assert_eq!(
        sum(
            samples,
            "kinesis_dataflow_get_records_total",
            &[s, "outcome=\"failed\""]
        ),
        0.0
    );
}

/// Per stream: leases.
fn check_the_lease_metrics(samples: &BTreeMap<String, f64>, l: &Labels) {
    let labels = l.both();
    assert_eq!(sum(samples, "kinesis_dataflow_leases_held", &labels), 2.0);
    assert_eq!(
        sum(samples, "kinesis_dataflow_leases_taken_total", &labels),
        2.0
    );
    assert_eq!(
        sum(samples, "kinesis_dataflow_leases_lost_total", &labels),
        0.0
    );
    assert_eq!(
        count(samples, "kinesis_dataflow_leases_handed_off_total", &labels),
        1
    );
    assert_eq!(
        sum(
            samples,
            "kinesis_dataflow_lease_take_seconds_count",
            &labels
        ),
        2.0
    );
}

/// The publisher.
fn check_the_publisher_metrics(samples: &BTreeMap<String, f64>, s: &str) {
    assert_eq!(
        sum(
            samples,
            "kinesis_dataflow_published_records_total",
            &[s, "outcome=\"ok\""]
        ),
        RECORDS
    );
    assert_eq!(
        sum(
            samples,
            "kinesis_dataflow_published_records_total",
            &[s, "outcome=\"failed\""]
        ),
        0.0
    );
    assert_eq!(
        count(samples, "kinesis_dataflow_publish_retries_total", &[s]),
        1
    );
    assert_eq!(
        count(samples, "kinesis_dataflow_publish_throttled_total", &[s]),
        1
    );
    assert!(
        sum(
            samples,
            "kinesis_dataflow_publish_batch_records_count",
            &[s]
        ) >= 1.0
    );
}

/// A graceful stop: SIGTERM, and the example exits successfully.
async fn stop_gracefully(mut child: tokio::process::Child) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_during_a_run_shows_every_metric_with_plausible_values() {
    let client = support::kinesis_client();
    let stream = support::unique_name("metrics");
    support::create_stream(&client, &stream, 2).await;
    let application = support::unique_name("metrics-app");
    let port = support::free_port().unwrap();
    let child = start_example(&stream, &application, port);
    let labels = Labels::new(&stream, &application);
    let samples = scrape_until_drained(port, &labels).await;
    check_the_per_shard_metrics(&samples, &labels);
    check_the_settlement_metrics(&samples, &labels.s);
    check_the_get_records_metrics(&samples, &labels.s);
    check_the_lease_metrics(&samples, &labels);
    check_the_publisher_metrics(&samples, &labels.s);
    stop_gracefully(child).await;
}
