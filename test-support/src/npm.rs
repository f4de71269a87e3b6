//! The emulators' npm packages: `npm ci` in `harness/` when they are missing, under a
//! cross-process lock (several test binaries, or a test run and a bench, may start at once).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use crate::paths::{binary_name, harness_dir, target_dir};

/// How long to wait for another process's `npm ci` before giving up.
const LOCK_TIMEOUT: Duration = Duration::from_secs(600);
/// A lock directory older than this is considered abandoned.
const LOCK_STALE_AFTER: Duration = Duration::from_secs(900);
/// Pause between two looks at a lock held by another process.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// Makes sure `harness/node_modules` holds the pinned emulators, running `npm ci` under a
/// cross-process lock (`target/emulator-npm-ci.lock/`) when they are missing. Cheap once they
/// are installed.
///
/// # Errors
///
/// A message naming the command and its output when npm cannot run or fails, or when another
/// process held the lock for longer than 10 minutes.
pub fn ensure_npm_packages() -> Result<(), String> {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_none() {
        install(&harness_dir(), &target_dir().join("emulator-npm-ci.lock"))?;
        let _ = DONE.set(());
    }
    Ok(())
}

fn packages_present(harness: &Path) -> bool {
    harness.join("node_modules/kinesis-local/main.js").is_file()
        && harness.join("node_modules/dynalite/cli.js").is_file()
        && harness
            .join("node_modules/aws-kinesis-agg/index.js")
            .is_file()
}

/// Removes the lock directory when dropped.
struct LockGuard(PathBuf);

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Whether the lock at `lock` was left behind by a process that is gone, or is older than any
/// install could take.
fn lock_is_stale(lock: &Path) -> bool {
    if let Ok(owner) = fs::read_to_string(lock.join("owner"))
        && let Some(pid) = owner.split_whitespace().next()
        && Path::new("/proc/self").exists()
        && !Path::new("/proc").join(pid).exists()
    {
        return true;
    }
    fs::metadata(lock)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > LOCK_STALE_AFTER)
}

fn install(harness: &Path, lock: &Path) -> Result<(), String> {
    let started = Instant::now();
    loop {
        // Files first, lock second: if the files exist and nobody holds the lock afterwards,
        // whoever created them has finished.
        if packages_present(harness) && !lock.exists() {
            return Ok(());
        }
        if let Some(parent) = lock.parent() {
            let _ = fs::create_dir_all(parent);
        }
        match fs::create_dir(lock) {
            Ok(()) => return install_locked(harness, lock),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                if lock_is_stale(lock) {
                    eprintln!("test harness: removing stale npm lock {}", lock.display());
                    let _ = fs::remove_dir_all(lock);
                    continue;
                }
                if started.elapsed() > LOCK_TIMEOUT {
                    return Err(format!(
                        "test harness: waited {LOCK_TIMEOUT:?} for another process's `npm ci` \
                         (lock {}); remove the lock if no test is running",
                        lock.display()
                    ));
                }
                std::thread::sleep(LOCK_POLL);
            }
            Err(err) => {
                return Err(format!(
                    "test harness: cannot create the npm lock {}: {err}",
                    lock.display()
                ));
            }
        }
    }
}

/// Runs `npm ci` if still needed, holding the lock `lock` (just created), and removes the lock.
fn install_locked(harness: &Path, lock: &Path) -> Result<(), String> {
    let _guard = LockGuard(lock.to_path_buf());
    let _ = fs::write(
        lock.join("owner"),
        format!("{} {}\n", std::process::id(), binary_name()),
    );
    if packages_present(harness) {
        return Ok(());
    }
    run_npm_ci(harness)
}

fn run_npm_ci(harness: &Path) -> Result<(), String> {
    let command = format!("npm ci --no-audit --no-fund (in {})", harness.display());
    eprintln!("test harness: emulators not installed; running {command}");
    let output = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(harness)
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(format!(
                "test harness: `{command}` failed with {}:\n--- stdout ---\n{}\n--- stderr \
                 ---\n{}\n(Node.js and npm are needed to run the emulators)",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            ));
        }
        Err(err) => {
            return Err(format!(
                "test harness: cannot run `{command}`: {err}. Node.js (with npm) must be on \
                 PATH to run the Kinesis and DynamoDB emulators"
            ));
        }
    }
    if !packages_present(harness) {
        return Err(format!(
            "test harness: `{command}` succeeded but harness/node_modules/kinesis-local/main.js \
             or harness/node_modules/dynalite/cli.js is still missing"
        ));
    }
    Ok(())
}
