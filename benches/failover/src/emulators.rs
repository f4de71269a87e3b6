//! kinesis-local and dynalite, from the npm packages pinned in `harness/`, started through
//! `harness/launch.js` on free ports, as `tests/support/mod.rs` does for the tests.
//!
//! Each launcher gets a piped stdin and stops its emulator when that pipe closes: when
//! [`Emulator::stop`] drops it, or when this process ends in any way.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_sdk_kinesis::config::timeout::TimeoutConfig;

use crate::{BoxError, Result, sdk_config};

/// How long an emulator may take to answer its first call.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How many times an emulator that exits during start-up (lost its port) is started again.
const START_ATTEMPTS: u32 = 3;

/// Which emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Kinesis,
    DynamoDb,
}

impl Kind {
    fn arg(self) -> &'static str {
        match self {
            Kind::Kinesis => "kinesis",
            Kind::DynamoDb => "dynamodb",
        }
    }
}

/// A running emulator (its `launch.js`).
pub struct Emulator {
    kind: Kind,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The emulator's output.
    pub log: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Emulator {
    /// Starts the emulator and waits until it answers a signed API call.
    pub async fn start(kind: Kind, repo: &Path, logs: &Path) -> Result<Self> {
        let mut attempt = 1;
        loop {
            let mut emulator = Self::spawn(kind, repo, logs)?;
            match emulator.wait_ready().await {
                Ok(()) => return Ok(emulator),
                Err(e) => {
                    let exited = emulator.exited();
                    emulator.stop();
                    if !exited || attempt == START_ATTEMPTS {
                        return Err(format!(
                            "the {} emulator did not start: {e} (log: {})",
                            kind.arg(),
                            emulator.log.display()
                        )
                        .into());
                    }
                    attempt += 1;
                }
            }
        }
    }

    fn spawn(kind: Kind, repo: &Path, logs: &Path) -> Result<Self> {
        let port = free_port()?;
        let tls_port = match kind {
            Kind::Kinesis => loop {
                let p = free_port()?;
                if p != port {
                    break p;
                }
            },
            Kind::DynamoDb => 0,
        };
        let log = logs.join(format!("{}.log", kind.arg()));
        let open = || fs::OpenOptions::new().create(true).append(true).open(&log);
        let mut child = Command::new("node")
            .arg(repo.join("harness/launch.js"))
            .arg(kind.arg())
            .arg(port.to_string())
            .arg(tls_port.to_string())
            .arg(&log)
            .current_dir(repo)
            .stdin(Stdio::piped())
            .stdout(open()?)
            .stderr(open()?)
            .spawn()
            .map_err(|e| format!("cannot run node (Node.js must be on PATH): {e}"))?;
        let stdin = child.stdin.take();
        Ok(Self {
            kind,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
            child,
            stdin,
        })
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let config = sdk_config();
        loop {
            if self.exited() {
                return Err("the emulator exited".into());
            }
            let last = match probe(self.kind, &config, &self.endpoint).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if started.elapsed() > READY_TIMEOUT {
                return Err(
                    format!("no answer within {READY_TIMEOUT:?}; last error: {last}").into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Closes the launcher's stdin (it stops the emulator: SIGTERM, SIGKILL 2 s later) and
    /// waits for it, killing it after 3 s.
    pub fn stop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if self.exited() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            self.stop();
        }
    }
}

/// One signed call; `Ok` once the emulator answers it.
async fn probe(kind: Kind, config: &SdkConfig, endpoint: &str) -> Result<()> {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_timeout(Duration::from_secs(3))
        .build();
    match kind {
        Kind::Kinesis => {
            let conf = aws_sdk_kinesis::config::Builder::from(config)
                .endpoint_url(endpoint)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build();
            aws_sdk_kinesis::Client::from_conf(conf)
                .list_streams()
                .send()
                .await
                .map(drop)
                .map_err(|e| {
                    BoxError::from(aws_sdk_kinesis::error::DisplayErrorContext(e).to_string())
                })
        }
        Kind::DynamoDb => {
            let conf = aws_sdk_dynamodb::config::Builder::from(config)
                .endpoint_url(endpoint)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build();
            aws_sdk_dynamodb::Client::from_conf(conf)
                .list_tables()
                .send()
                .await
                .map(drop)
                .map_err(|e| {
                    BoxError::from(aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string())
                })
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Runs `npm ci --prefix harness` when the pinned emulators are not installed yet.
pub fn ensure_installed(repo: &Path) -> Result<()> {
    let harness = repo.join("harness");
    let present = || {
        harness.join("node_modules/kinesis-local/main.js").is_file()
            && harness.join("node_modules/dynalite/cli.js").is_file()
    };
    if present() {
        return Ok(());
    }
    eprintln!("emulators not installed: running npm ci --prefix harness");
    let status = Command::new("npm")
        .args(["ci", "--prefix"])
        .arg(&harness)
        .args(["--no-audit", "--no-fund"])
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run npm (Node.js and npm must be on PATH): {e}"))?;
    if !status.success() || !present() {
        return Err(format!("npm ci --prefix {} failed ({status})", harness.display()).into());
    }
    Ok(())
}
