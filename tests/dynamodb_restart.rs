//! DynamoDB down for longer than the lease duration, then back: a dynalite of this test's own,
//! with a data directory, is stopped and started again on the same port (its tables survive
//! in the directory, as they would on the service). The readers stop once they cannot renew;
//! nothing delivered while it was down is checkpointed by the instance that lost its leases
//! (it comes again after the restart); and after the restart everything is delivered. The
//! scenario and its checks are in `tests/support/outage.rs`.

#![forbid(unsafe_code)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kinesis_dataflow::DynamoLeaseStore;
use tokio::process::{Child, Command};

/// This test's own dynalite, keeping its tables in `dir`, through `harness/launch.js` (which
/// stops it when its standard input closes).
struct Dynalite {
    launcher: Child,
}

impl Dynalite {
    async fn start(port: u16, dir: &std::path::Path, log: &std::path::Path) -> Self {
        let launcher = Command::new("node")
            .arg(support::harness_dir().join("launch.js"))
            .args(["dynamodb", &port.to_string(), "0"])
            .arg(log)
            .env("DYNALITE_PATH", dir)
            .stdin(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts harness/launch.js");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "dynalite did not listen on {port}; see {}",
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { launcher }
    }

    /// Stops it (closing the launcher's stdin stops dynalite) and waits until it is gone.
    async fn stop(mut self, port: u16) {
        drop(self.launcher.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.launcher.wait()).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "dynalite kept listening"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_stop_while_dynamodb_is_down_and_everything_arrives_after_its_restart() {
    let port = free_port();
    let dir = support::target_dir().join(format!("dynalite-data-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = support::logs_dir().join("dynalite-restart.log");
    let running = Mutex::new(Some(Dynalite::start(port, &dir, &log).await));
    let store = Arc::new(
        DynamoLeaseStore::new(
            aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&support::sdk_config())
                    .endpoint_url(format!("http://127.0.0.1:{port}"))
                    .build(),
            ),
            support::unique_name("restart-leases"),
        )
        .unwrap(),
    );
    support::outage::lease_table_outage(
        "restart",
        store,
        async {
            let down = running.lock().unwrap().take();
            if let Some(dynalite) = down {
                dynalite.stop(port).await;
            }
        },
        async {
            // The same tables, from the data directory.
            let up = Dynalite::start(port, &dir, &log).await;
            *running.lock().unwrap() = Some(up);
        },
    )
    .await;
    let last = running.lock().unwrap().take();
    if let Some(dynalite) = last {
        dynalite.stop(port).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
