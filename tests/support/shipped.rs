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
