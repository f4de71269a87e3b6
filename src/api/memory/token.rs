//! Shard iterators and ListShards page tokens: opaque, stateless, tamper-evident strings.
//!
//! A token carries everything needed to answer with it (the store instance, the stream, the
//! shard, a position, and for iterators the issue time), so the store keeps nothing per token
//! and nothing accumulates however many are issued. The text is the hex of the fields plus
//! an MD5 check, so a truncated or edited token is refused as malformed.

use std::fmt::Write as _;

use md5::{Digest, Md5};

/// What a shard iterator names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IteratorToken {
    /// The store instance that issued it.
    pub(crate) instance: u64,
    /// The stream name.
    pub(crate) stream: String,
    /// The shard's number.
    pub(crate) shard: u64,
    /// The position of the next record to read.
    pub(crate) position: u64,
    /// When it was issued: nanoseconds since the store's epoch (a `tokio::time::Instant`).
    pub(crate) issued_nanos: u64,
}

/// What a ListShards page token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PageToken {
    /// The store instance that issued it.
    pub(crate) instance: u64,
    /// The stream name.
    pub(crate) stream: String,
    /// The index (in shard-id order) of the first shard of the next page.
    pub(crate) index: usize,
}

const ITERATOR_KIND: &str = "shard-iterator-v1";
const PAGE_KIND: &str = "list-shards-v1";

fn checksum(payload: &str) -> String {
    let digest = Md5::digest(payload.as_bytes());
    digest[..6].iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn seal(fields: &[&str]) -> String {
    let payload = fields.join("|");
    let sealed = format!("{payload}|{}", checksum(&payload));
    sealed.bytes().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02X}");
        out
    })
}

fn open(text: &str, kind: &str, field_count: usize) -> Option<Vec<String>> {
    if text.is_empty() || !text.len().is_multiple_of(2) || text.len() > 4096 {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let sealed = String::from_utf8(bytes).ok()?;
    let (payload, check) = sealed.rsplit_once('|')?;
    if check != checksum(payload) {
        return None;
    }
    let fields: Vec<String> = payload.split('|').map(str::to_owned).collect();
    (fields.len() == field_count && fields[0] == kind).then_some(fields)
}

impl IteratorToken {
    /// The iterator's text.
    pub(crate) fn encode(&self) -> String {
        seal(&[
            ITERATOR_KIND,
            &self.instance.to_string(),
            &self.stream,
            &self.shard.to_string(),
            &self.position.to_string(),
            &self.issued_nanos.to_string(),
        ])
    }

    /// Reads an iterator back, or `None` when it is malformed.
    pub(crate) fn decode(text: &str) -> Option<Self> {
        let fields = open(text, ITERATOR_KIND, 6)?;
        Some(Self {
            instance: fields[1].parse().ok()?,
            stream: fields[2].clone(),
            shard: fields[3].parse().ok()?,
            position: fields[4].parse().ok()?,
            issued_nanos: fields[5].parse().ok()?,
        })
    }
}

impl PageToken {
    /// The token's text.
    pub(crate) fn encode(&self) -> String {
        seal(&[
            PAGE_KIND,
            &self.instance.to_string(),
            &self.stream,
            &self.index.to_string(),
        ])
    }

    /// Reads a token back, or `None` when it is malformed.
    pub(crate) fn decode(text: &str) -> Option<Self> {
        let fields = open(text, PAGE_KIND, 4)?;
        Some(Self {
            instance: fields[1].parse().ok()?,
            stream: fields[2].clone(),
            index: fields[3].parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterators_round_trip_and_refuse_edits() {
        let token = IteratorToken {
            instance: 7,
            stream: "orders.v1-x_y".into(),
            shard: 3,
            position: 42,
            issued_nanos: 1_000_000,
        };
        let text = token.encode();
        assert_eq!(IteratorToken::decode(&text), Some(token));
        assert_eq!(IteratorToken::decode(&text[..text.len() - 2]), None);
        assert_eq!(IteratorToken::decode(&text[1..]), None);
        assert_eq!(IteratorToken::decode("not an iterator"), None);
        assert_eq!(IteratorToken::decode(""), None);
        assert_eq!(IteratorToken::decode("éé"), None);
        let mut edited = text.into_bytes();
        edited[10] = if edited[10] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            IteratorToken::decode(&String::from_utf8(edited).unwrap_or_default()),
            None
        );
    }

    #[test]
    fn page_tokens_are_not_iterators() {
        let page = PageToken {
            instance: 1,
            stream: "s".into(),
            index: 5,
        };
        let text = page.encode();
        assert_eq!(PageToken::decode(&text), Some(page));
        assert_eq!(IteratorToken::decode(&text), None);
    }
}
