//! What the fleet simulation's lease-table reads would cost in DynamoDB, for both key layouts:
//! item sizes by DynamoDB's rules (attribute names and values), and read units as DynamoDB
//! charges consistent reads (a Query or Scan page: its items' total size rounded up to 4 KB;
//! `BatchGetItem`: each item rounded up to 4 KB).

use kinesis_dataflow::lease::Lease;
use kinesis_dataflow::position::Checkpoint;

/// The size of a number attribute's value: a byte per two digits, plus one (zero: one byte).
fn number(n: u64) -> usize {
    if n == 0 {
        return 1;
    }
    n.to_string().len().div_ceil(2) + 1
}

/// The size of `lease`'s item; `single_key` adds the `leaseKey` attribute of the older layout.
pub fn item_bytes(lease: &Lease, single_key: bool) -> usize {
    let text = |name: &str, value: &str| name.len() + value.len();
    let mut bytes = text("streamName", &lease.stream)
        + text("shardId", &lease.shard_id)
        + "leaseCounter".len()
        + number(lease.counter)
        // Milliseconds since the epoch: 13 digits.
        + "lastWrittenAt".len()
        + number(1_764_700_123_456);
    if single_key {
        bytes += text("leaseKey", &format!("{}#{}", lease.stream, lease.shard_id));
    }
    if let Some(owner) = &lease.owner {
        bytes += text("leaseOwner", owner);
    }
    if let Some(checkpoint) = &lease.checkpoint {
        bytes += text("checkpoint", &checkpoint.encode());
    }
    if let Some(start) = &lease.starting_sequence_number {
        bytes += text("startingSequenceNumber", start);
    }
    if !lease.parents.is_empty() {
        // A list: 3 bytes, and a byte per element besides its value.
        bytes +=
            "parentShardIds".len() + 3 + lease.parents.iter().map(|p| p.len() + 1).sum::<usize>();
    }
    if let Some(limits) = &lease.limits {
        bytes += "workerWeight".len() + number(u64::from(limits.weight));
        if let Some(max) = limits.max_leases {
            bytes += "workerMaxLeases".len() + number(u64::from(max));
        }
    }
    bytes
}

/// Read units of one page (or item) of `bytes` (consistent: a unit per 4 KB, at least one), in
/// thousandths, as the tally counts them. A Scan of several pages rounds each page up; the
/// difference is under a unit per page.
pub fn units(bytes: usize) -> u64 {
    bytes.div_ceil(4096).max(1) as u64 * 1000
}

/// A row of an idle neighbour stream sharing the table: held, checkpointed, as rows of a busy
/// table are.
pub fn neighbour(stream: &str, shard: u32) -> Lease {
    let mut lease = Lease::new(stream, format!("shardId-{shard:012}"), Vec::new());
    lease.owner = Some(format!("instance-{:02}", shard % 20));
    lease.counter = 123_456;
    lease.checkpoint = Some(Checkpoint::Sequence("4".repeat(56)));
    lease.starting_sequence_number = Some("4".repeat(56));
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_costs_what_dynamodb_counts() {
        // The sizes dynalite's own size function gives the same items: 74 bytes for a free row
        // keyed by stream, 106 with `leaseKey`, 202 held and checkpointed with a parent.
        let mut lease = Lease::new("s01", "shardId-000000000001", vec![]);
        assert_eq!(item_bytes(&lease, false), 74);
        assert_eq!(item_bytes(&lease, true), 106);
        lease.owner = Some("instance-07".into());
        lease.counter = 123_456;
        lease.checkpoint = Some(Checkpoint::Sequence("4".repeat(56)));
        lease.parents = vec!["shardId-000000000000".into()];
        assert_eq!(item_bytes(&lease, false), 202);
        assert_eq!(units(0), 1000);
        assert_eq!(units(4096), 1000);
        assert_eq!(units(4097), 2000);
    }
}
