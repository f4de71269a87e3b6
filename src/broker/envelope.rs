//! The header envelope: how a message's headers ride in a Kinesis record, which carries only
//! data and a partition key.
//!
//! A record whose data starts with the magic bytes is an envelope:
//!
//! ```text
//! magic (4 bytes: E5 52 53 48, "?RSH") | version (1 byte: 1) | header count (u16, big-endian)
//! | for each header: name length (u16) | name (UTF-8) | value length (u32) | value
//! | payload (the rest)
//! ```
//!
//! A message without headers is written as its bare payload, so other consumers of the
//! stream read it unchanged; only a payload that itself starts with the magic bytes is
//! wrapped (in an envelope with no headers), so decoding is never ambiguous for records this
//! broker wrote. Data that starts with the magic but does not parse is taken as a bare
//! payload. The magic differs from the KPL aggregation magic (`F3 89 9A C2`). The envelope
//! counts toward the service's 1 MiB record limit.

use bytes::{BufMut, Bytes, BytesMut};
use ruststream::HeaderMap;

/// The first bytes of an envelope.
pub const MAGIC: [u8; 4] = [0xE5, 0x52, 0x53, 0x48];
/// The envelope format version.
const VERSION: u8 = 1;

/// The record data for `payload` with `headers`.
///
/// # Panics
///
/// Never for headers a publish can carry: a header name over 65,535 bytes, a value over
/// 4 GiB or more than 65,535 headers are refused by [`check`] first.
pub(crate) fn encode(headers: &HeaderMap, payload: &[u8]) -> Bytes {
    if headers.is_empty() && !payload.starts_with(&MAGIC) {
        return Bytes::copy_from_slice(payload);
    }
    let size = 7
        + headers
            .iter()
            .map(|(name, value)| 6 + name.len() + value.len())
            .sum::<usize>()
        + payload.len();
    let mut out = BytesMut::with_capacity(size);
    out.put_slice(&MAGIC);
    out.put_u8(VERSION);
    out.put_u16(u16::try_from(headers.len()).expect("checked"));
    for (name, value) in headers.iter() {
        out.put_u16(u16::try_from(name.len()).expect("checked"));
        out.put_slice(name.as_bytes());
        out.put_u32(u32::try_from(value.len()).expect("checked"));
        out.put_slice(value);
    }
    out.put_slice(payload);
    out.freeze()
}

/// Why `headers` cannot be encoded, if they cannot.
pub(crate) fn check(headers: &HeaderMap) -> Result<(), String> {
    if headers.len() > usize::from(u16::MAX) {
        return Err(format!("{} headers (at most {})", headers.len(), u16::MAX));
    }
    for (name, value) in headers.iter() {
        if name.len() > usize::from(u16::MAX) || u32::try_from(value.len()).is_err() {
            return Err(format!("header `{name}` is too long for the envelope"));
        }
    }
    Ok(())
}

/// The headers and the payload's offset in `data`.
pub(crate) fn decode(data: &[u8]) -> (HeaderMap, usize) {
    parse(data).unwrap_or_else(|| (HeaderMap::new(), 0))
}

fn parse(data: &[u8]) -> Option<(HeaderMap, usize)> {
    let rest = data.strip_prefix(&MAGIC)?;
    let (&version, rest) = rest.split_first()?;
    if version != VERSION {
        return None;
    }
    let mut at = data.len() - rest.len();
    let mut take = |n: usize| -> Option<&[u8]> {
        let slice = data.get(at..at.checked_add(n)?)?;
        at += n;
        Some(slice)
    };
    let count = u16::from_be_bytes(take(2)?.try_into().ok()?);
    let mut headers = HeaderMap::with_capacity(usize::from(count));
    for _ in 0..count {
        let name_len = u16::from_be_bytes(take(2)?.try_into().ok()?);
        let name = std::str::from_utf8(take(usize::from(name_len))?)
            .ok()?
            .to_owned();
        let value_len = u32::from_be_bytes(take(4)?.try_into().ok()?);
        let value = Bytes::copy_from_slice(take(usize::try_from(value_len).ok()?)?);
        headers.insert(name, value);
    }
    Some((headers, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_headers_and_payload() {
        let mut headers = HeaderMap::new();
        headers.insert("x-ruststream-retry-count", Bytes::from_static(b"1"));
        headers.insert("binary", Bytes::from_static(&[0, 255, 1]));
        let data = encode(&headers, b"payload");
        let (decoded, offset) = decode(&data);
        assert_eq!(&data[offset..], b"payload");
        assert_eq!(decoded.get("x-ruststream-retry-count"), Some(&b"1"[..]));
        assert_eq!(decoded.get("binary"), Some(&[0, 255, 1][..]));
        assert_eq!(decoded.len(), 2);
    }

    #[test]
    fn bare_payloads_stay_bare_and_magic_payloads_are_wrapped() {
        let plain = encode(&HeaderMap::new(), b"{\"a\":1}");
        assert_eq!(&plain[..], b"{\"a\":1}");
        assert_eq!(decode(&plain).1, 0);
        let mut tricky = MAGIC.to_vec();
        tricky.extend_from_slice(b"rest");
        let wrapped = encode(&HeaderMap::new(), &tricky);
        let (headers, offset) = decode(&wrapped);
        assert!(headers.is_empty());
        assert_eq!(&wrapped[offset..], &tricky[..]);
        // Truncated envelopes read as bare payloads.
        assert_eq!(decode(&wrapped[..6]).1, 0);
        assert_eq!(decode(&MAGIC).1, 0);
    }
}
