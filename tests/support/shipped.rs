//! The spec example's handler logs `shipped` with the customer and the sequence number; this
//! reads those events back (through [`super::events`]), so a test sees what the handler saw.

use super::events;

/// The `shipped` events the handler logged so far: (customer, seq).
pub fn shipped() -> Vec<(String, u64)> {
    events::events("shipped")
        .into_iter()
        .filter_map(|f| {
            Some((
                f.get("shipment.customer")?.clone(),
                f.get("shipment.seq")?.parse().ok()?,
            ))
        })
        .collect()
}

/// Forgets the `shipped` events logged so far.
pub fn clear_shipped() {
    events::forget("shipped", |_| true);
}

/// Installs the recorder as the test binary's one global subscriber (once).
pub fn record_shipments() {
    events::record_events();
}

/// (customer, seq) of a `shipped` line the example binary printed, if `line` is one.
pub fn shipped_line(line: &str) -> Option<(String, u64)> {
    let field = |name: &str| {
        let start = line.find(name)? + name.len();
        let rest = &line[start..];
        let end = rest.find(' ').unwrap_or(rest.len());
        Some(rest[..end].trim_matches('"').to_owned())
    };
    if !line.contains("shipped") {
        return None;
    }
    Some((
        field("shipment.customer=")?,
        field("shipment.seq=")?.parse().ok()?,
    ))
}
