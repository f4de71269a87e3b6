//! Output for people: aligned tables, checkpoints and positions in words.

use kinesis_dataflow::StartingPoint;
use kinesis_dataflow::position::Checkpoint;

use crate::time;

/// Lays `rows` out under `headers`, columns padded to their widest cell, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A starting point in words: `TRIM_HORIZON`, `AT_TIMESTAMP 2026-...Z`, ...
pub fn point(point: &StartingPoint) -> String {
    match point {
        StartingPoint::TrimHorizon => "TRIM_HORIZON".to_owned(),
        StartingPoint::Latest => "LATEST".to_owned(),
        StartingPoint::AtTimestamp(ms) => format!("AT_TIMESTAMP {}", time::format(*ms)),
        StartingPoint::AtSequence(seq) => format!("AT_SEQUENCE_NUMBER {seq}"),
        StartingPoint::AfterSequence(seq) => format!("AFTER_SEQUENCE_NUMBER {seq}"),
        StartingPoint::AfterSubSequence(seq, sub) => {
            format!("AFTER_SUB_SEQUENCE_NUMBER {seq}:{sub}")
        }
    }
}

/// A checkpoint in words (the table form; JSON carries [`Checkpoint::encode`]).
pub fn checkpoint(checkpoint: Option<&Checkpoint>) -> String {
    match checkpoint {
        None => "- (from its start, after its parents)".to_owned(),
        Some(Checkpoint::Sequence(seq)) => seq.clone(),
        Some(Checkpoint::SubSequence(seq, sub)) => format!("{seq}:{sub}"),
        Some(Checkpoint::ShardEnd) => "SHARD_END".to_owned(),
        Some(Checkpoint::Start(p)) => format!("from {}", point(p)),
        Some(Checkpoint::Initial(p)) => format!("unread, begins {}", point(p)),
    }
}

/// What kind of checkpoint, for JSON: `sequence`, `sub_sequence`, `shard_end`, `start`,
/// `initial`, or `none`.
pub fn checkpoint_kind(checkpoint: Option<&Checkpoint>) -> &'static str {
    match checkpoint {
        None => "none",
        Some(Checkpoint::Sequence(_)) => "sequence",
        Some(Checkpoint::SubSequence(..)) => "sub_sequence",
        Some(Checkpoint::ShardEnd) => "shard_end",
        Some(Checkpoint::Start(_)) => "start",
        Some(Checkpoint::Initial(_)) => "initial",
    }
}

/// How long ago `written_ms` was (by the writer's clock), or `?` when unknown.
pub fn age(written_ms: Option<u64>, now_ms: u64) -> String {
    written_ms.map_or_else(|| "?".to_owned(), |w| time::human(now_ms.saturating_sub(w)))
}

/// `1 shard`, `2 shards`: a count and a noun, plural unless the count is one.
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Prints a JSON document: pretty, or on one line (a stream of documents under --watch).
pub fn print_json(value: &serde_json::Value, one_line: bool) {
    let text = if one_line {
        value.to_string()
    } else {
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    };
    println!("{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let out = table(
            &["A", "LONGER"],
            &[
                vec!["wide cell".into(), "x".into()],
                vec!["b".into(), "".into()],
            ],
        );
        assert_eq!(out, "A          LONGER\nwide cell  x\nb\n");
    }

    #[test]
    fn checkpoints_read_well() {
        assert_eq!(
            checkpoint(Some(&Checkpoint::Start(StartingPoint::AtTimestamp(0)))),
            "from AT_TIMESTAMP 1970-01-01T00:00:00.000Z"
        );
        assert_eq!(checkpoint(Some(&Checkpoint::ShardEnd)), "SHARD_END");
        assert_eq!(checkpoint_kind(None), "none");
    }
}
