//! One emulator, kinesis-local or dynalite, started through `harness/launch.js` on free ports.
//!
//! The launcher gets a piped stdin and stops its emulator when that pipe closes: when
//! [`Emulator::stop`] (or dropping the [`Emulator`]) closes it, or when this process ends in any
//! way. The npm packages must be installed first ([`crate::npm::ensure_npm_packages`]).

use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_sdk_kinesis::config::timeout::TimeoutConfig;

use crate::paths::{harness_dir, log_tail, repo_root};
use crate::sdk::sdk_config;

/// How long an emulator may take to answer its first API call.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two readiness probes.
const READY_POLL: Duration = Duration::from_millis(100);
/// How many times to start an emulator that exits before answering (it lost its port).
const START_ATTEMPTS: u32 = 3;
/// How long a stopped launcher may take to exit before it is killed.
const STOP_PATIENCE: Duration = Duration::from_secs(3);
/// How many trailing log lines a failure message shows.
const LOG_TAIL_LINES: usize = 40;

/// Which emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// kinesis-local, with a TLS (HTTP/2) listener on a second port.
    Kinesis,
    /// dynalite, in memory.
    DynamoDb,
}

impl Kind {
    /// The name `launch.js` takes, also the log file's stem: `kinesis` or `dynamodb`.
    pub fn arg(self) -> &'static str {
        match self {
            Kind::Kinesis => "kinesis",
            Kind::DynamoDb => "dynamodb",
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running emulator (its `launch.js`), stopped when dropped.
#[derive(Debug)]
pub struct Emulator {
    kind: Kind,
    tls_port: u16,
    endpoint: String,
    log: PathBuf,
    child: Mutex<Child>,
    stdin: Mutex<Option<ChildStdin>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Emulator {
    /// Starts the emulator, its output appended to `<logs>/<kind>.log`, and waits until it
    /// answers a signed API call (`ListStreams`, `ListTables`; every 100 ms, up to 60 s). One
    /// that exits before answering is started again on new ports, up to 3 times.
    ///
    /// # Errors
    ///
    /// A message with the log's last lines when it cannot be started or does not answer.
    pub async fn start(kind: Kind, logs: &Path) -> Result<Self, String> {
        let mut attempt = 1;
        loop {
            let emulator = Self::spawn(kind, logs)?;
            let Err(err) = emulator.wait_ready().await else {
                return Ok(emulator);
            };
            let exited = emulator.check_alive().is_err();
            let message = emulator.failure(&err);
            emulator.stop();
            if !exited || attempt == START_ATTEMPTS {
                return Err(message);
            }
            eprintln!(
                "test harness: {} emulator exited during start-up (attempt {attempt}); \
                 retrying on new ports (log: {})",
                kind.arg(),
                emulator.log.display()
            );
            attempt += 1;
        }
    }

    /// [`Emulator::start`] on a std thread with a current-thread runtime of its own, so it
    /// works from plain code and from inside any tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`Emulator::start`].
    pub fn start_blocking(kind: Kind, logs: &Path) -> Result<Self, String> {
        let logs = logs.to_path_buf();
        let started = std::thread::Builder::new()
            .name(format!("{}-emulator-start", kind.arg()))
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("test harness: cannot build a tokio runtime: {e}"))?
                    .block_on(Self::start(kind, &logs))
            })
            .map_err(|e| format!("test harness: cannot spawn a thread: {e}"))?
            .join();
        started.unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(format!(
                "test harness: starting the {} emulator panicked: {what}",
                kind.arg()
            ))
        })
    }

    fn spawn(kind: Kind, logs: &Path) -> Result<Self, String> {
        let in_logs = |what: String| format!("test harness: {what} (logs: {})", logs.display());
        let port = free_port().map_err(|e| in_logs(format!("cannot find a free port: {e}")))?;
        let tls_port = match kind {
            Kind::Kinesis => loop {
                let p = free_port().map_err(|e| in_logs(format!("no free port: {e}")))?;
                if p != port {
                    break p;
                }
            },
            Kind::DynamoDb => 0,
        };
        let log = logs.join(format!("{}.log", kind.arg()));
        let open_log = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| in_logs(format!("cannot open {}: {e}", log.display())))
        };
        let launcher = harness_dir().join("launch.js");
        let mut child = Command::new("node")
            .arg(&launcher)
            .args([kind.arg(), &port.to_string(), &tls_port.to_string()])
            .arg(&log)
            .current_dir(repo_root())
            .stdin(Stdio::piped())
            .stdout(open_log()?)
            .stderr(open_log()?)
            .spawn()
            .map_err(|err| {
                in_logs(format!(
                    "cannot run `node {} {} {port} {tls_port} {}`: {err}. Node.js must be on \
                     PATH to run the emulators",
                    launcher.display(),
                    kind.arg(),
                    log.display(),
                ))
            })?;
        let stdin = child.stdin.take();
        Ok(Self {
            kind,
            tls_port,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
            child: Mutex::new(child),
            stdin: Mutex::new(stdin),
        })
    }

    /// Which emulator this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Port of kinesis-local's TLS (HTTP/2) listener, which serves a self-signed certificate;
    /// 0 for dynalite.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The emulator's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Err` if the launcher (and so the emulator) has exited.
    ///
    /// # Errors
    ///
    /// A message saying how it ended.
    pub fn check_alive(&self) -> Result<(), String> {
        match lock(&self.child).try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the {} emulator exited ({status})",
                self.kind.arg()
            )),
            Err(err) => Err(format!(
                "cannot poll the {} emulator's launcher: {err}",
                self.kind.arg()
            )),
        }
    }

    /// Polls the emulator with one API call every [`READY_POLL`] until it answers, it dies, or
    /// [`READY_TIMEOUT`] passes.
    async fn wait_ready(&self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            self.check_alive()?;
            let last_error = match probe(self.kind, &self.endpoint).await {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            if started.elapsed() > READY_TIMEOUT {
                return Err(format!(
                    "the {} emulator did not answer within {READY_TIMEOUT:?}; last error: \
                     {last_error}",
                    self.kind.arg(),
                ));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Closes the launcher's stdin (it stops the emulator: SIGTERM, SIGKILL 2 s later) and
    /// waits for it to exit, killing it after 3 s.
    pub fn stop(&self) {
        drop(lock(&self.stdin).take());
        let mut child = lock(&self.child);
        let deadline = Instant::now() + STOP_PATIENCE;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// `what` went wrong, with the endpoint, the log's path and its last lines.
    pub fn failure(&self, what: &str) -> String {
        let logs = self.log.parent().unwrap_or(&self.log);
        format!(
            "test harness: {what}\n  endpoint: {}\n  log: {}\n  logs dir: {}\n--- last lines of \
             {} ---\n{}",
            self.endpoint,
            self.log.display(),
            logs.display(),
            self.log.display(),
            log_tail(&self.log, LOG_TAIL_LINES)
        )
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if lock(&self.stdin).is_some() {
            self.stop();
        }
    }
}

/// One API call against the emulator, without retries; `Ok` once it answers successfully.
async fn probe(kind: Kind, endpoint: &str) -> Result<(), String> {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_timeout(Duration::from_secs(3))
        .build();
    let config = sdk_config();
    match kind {
        Kind::Kinesis => {
            let conf = aws_sdk_kinesis::config::Builder::from(&config)
                .endpoint_url(endpoint)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build();
            aws_sdk_kinesis::Client::from_conf(conf)
                .list_streams()
                .send()
                .await
                .map(drop)
                .map_err(|e| format!("{:?}", aws_sdk_kinesis::error::DisplayErrorContext(e)))
        }
        Kind::DynamoDb => {
            let conf = aws_sdk_dynamodb::config::Builder::from(&config)
                .endpoint_url(endpoint)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build();
            aws_sdk_dynamodb::Client::from_conf(conf)
                .list_tables()
                .send()
                .await
                .map(drop)
                .map_err(|e| format!("{:?}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npm::ensure_npm_packages;
    use crate::paths::target_dir;

    #[test]
    fn an_emulator_answers_until_it_is_stopped() {
        ensure_npm_packages().unwrap();
        let logs = target_dir().join(format!("launcher-test-{}", std::process::id()));
        fs::create_dir_all(&logs).unwrap();
        let emulator = Emulator::start_blocking(Kind::DynamoDb, &logs).unwrap();
        assert!(emulator.endpoint().starts_with("http://127.0.0.1:"));
        assert_eq!((emulator.kind(), emulator.tls_port()), (Kind::DynamoDb, 0));
        assert_eq!(emulator.log(), logs.join("dynamodb.log"));
        emulator.check_alive().unwrap();
        emulator.stop();
        assert!(emulator.check_alive().is_err());
        assert!(emulator.failure("stopped").contains("dynamodb.log"));
        fs::remove_dir_all(&logs).unwrap();
    }
}
