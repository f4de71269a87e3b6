//! Progress lines on stderr while a long phase runs, so a person watching a run of several
//! minutes sees it is alive and how far it is. stdout (the figures, the `summary:` lines) is
//! left alone. Shared with `benches/failover` (included there with `#[path]`).

use std::time::{Duration, Instant};

/// How often a running phase prints its line. The first line comes one period in, so a phase
/// shorter than that prints nothing.
pub const EVERY: Duration = Duration::from_secs(3);

/// A tokio task printing `<label>: <status>, <elapsed> s` (`<elapsed> / <length> s` for a
/// window of known length) to stderr every [`EVERY`] until dropped. It only reads what the
/// measured code already keeps (atomic counters, a shared tally), so it costs the measurement
/// one line every few seconds.
#[must_use = "the ticker stops when dropped"]
#[derive(Debug)]
pub struct Progress(tokio::task::JoinHandle<()>);

impl Progress {
    /// `<label>: <status()>, <elapsed> s`; `status` may be empty.
    pub fn start(label: impl Into<String>, status: impl Fn() -> String + Send + 'static) -> Self {
        Self::spawn(label.into(), None, status)
    }

    /// `<label>: <done()> / <target> <unit>, <elapsed> s`.
    pub fn count(
        label: impl Into<String>,
        target: u64,
        unit: &'static str,
        done: impl Fn() -> u64 + Send + 'static,
    ) -> Self {
        Self::start(label, move || {
            format!("{} / {} {unit}", thousands(done()), thousands(target))
        })
    }

    /// A phase of known length: `<label>: <status()>, <elapsed> / <length> s`.
    pub fn window(
        label: impl Into<String>,
        length: Duration,
        status: impl Fn() -> String + Send + 'static,
    ) -> Self {
        Self::spawn(label.into(), Some(length), status)
    }

    fn spawn(
        label: String,
        length: Option<Duration>,
        status: impl Fn() -> String + Send + 'static,
    ) -> Self {
        let started = Instant::now();
        Self(tokio::spawn(async move {
            let mut every = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                let status = status();
                let mut line = label.clone();
                line.push(':');
                if !status.is_empty() {
                    line.push(' ');
                    line.push_str(&status);
                    line.push(',');
                }
                let elapsed = started.elapsed().as_secs();
                match length {
                    Some(length) => eprintln!("{line} {elapsed} / {} s", length.as_secs()),
                    None => eprintln!("{line} {elapsed} s"),
                }
            }
        }))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `1234567` as `1,234,567`.
#[must_use]
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
