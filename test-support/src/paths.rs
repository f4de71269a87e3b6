//! Where things are: the repository, `harness/`, Cargo's target directory, and this process's
//! folder of emulator logs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The repository root (where the root `Cargo.toml` and `harness/` are): the parent of this
/// crate's folder, `test-support/`.
pub fn repo_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .parent()
        .expect("test-support/ lies inside the repository")
        .to_path_buf()
}

/// The `harness/` folder holding `launch.js` and the npm packages.
pub fn harness_dir() -> PathBuf {
    repo_root().join("harness")
}

/// Cargo's target directory (`$CARGO_TARGET_DIR` if set, relative to the repository root when
/// relative, else `target/`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// Name of the running binary without Cargo's `-<hash>` suffix (`harness_smoke` for
/// `harness_smoke-0123abcd4567ef89`).
pub(crate) fn binary_name() -> String {
    let stem = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".to_owned());
    without_hash(&stem).to_owned()
}

/// `name` of `name-<hash>`, where the hash is 8 or more hex digits; else the whole stem.
fn without_hash(stem: &str) -> &str {
    match stem.rsplit_once('-') {
        Some((name, hash))
            if !name.is_empty()
                && hash.len() >= 8
                && hash.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            name
        }
        _ => stem,
    }
}

/// This process's log folder: `target/emulator-logs/<binary-name>-<pid>/`. Created on first
/// call; the process-wide emulators ([`crate::emulators`]) write their logs there. Print it from
/// a failing test to point at the emulators' output.
pub fn logs_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = target_dir().join("emulator-logs").join(format!(
            "{}-{}",
            binary_name(),
            std::process::id()
        ));
        if let Err(err) = fs::create_dir_all(&dir) {
            panic!(
                "test harness: cannot create the emulator log folder {}: {err}",
                dir.display()
            );
        }
        dir
    })
    .clone()
}

/// The last `n` lines of a log file, or a note saying why there are none.
pub fn log_tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            if lines.is_empty() {
                "(log is empty)".to_owned()
            } else {
                lines[start..].join("\n")
            }
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_hash_suffix_is_dropped_and_other_stems_are_kept() {
        assert_eq!(
            without_hash("harness_smoke-0123abcd4567ef89"),
            "harness_smoke"
        );
        assert_eq!(without_hash("failover"), "failover");
        assert_eq!(without_hash("kinesis-local"), "kinesis-local");
        assert_eq!(without_hash("a-1234567"), "a-1234567");
        assert_eq!(without_hash("-0123abcd"), "-0123abcd");
    }

    #[test]
    fn the_repository_root_holds_the_harness() {
        assert!(harness_dir().join("launch.js").is_file());
        assert!(repo_root().join("Cargo.toml").is_file());
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = target_dir().join(format!("log-tail-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        fs::write(&log, "one\ntwo\nthree\n").unwrap();
        assert_eq!(log_tail(&log, 2), "two\nthree");
        fs::write(&log, "").unwrap();
        assert_eq!(log_tail(&log, 2), "(log is empty)");
        assert!(log_tail(&dir.join("missing.log"), 2).starts_with("(cannot read "));
        fs::remove_dir_all(&dir).unwrap();
    }
}
