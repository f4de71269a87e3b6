//! The spec example's handler logs `shipped` with the customer and the sequence number; this
//! records those events, so a test sees what the handler saw.

use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// The `shipped` events the handler logged: (customer, seq).
pub fn shipped() -> &'static Mutex<Vec<(String, u64)>> {
    static SHIPPED: OnceLock<Mutex<Vec<(String, u64)>>> = OnceLock::new();
    SHIPPED.get_or_init(Mutex::default)
}

#[derive(Default)]
struct Shipped {
    message: bool,
    customer: Option<String>,
    seq: Option<u64>,
}

impl Visit for Shipped {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name().ends_with("customer") {
            self.customer = Some(value.to_owned());
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name().ends_with("seq") {
            self.seq = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}") == "shipped" {
            self.message = true;
        }
    }
}

struct Recorder;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut seen = Shipped::default();
        event.record(&mut seen);
        if let (true, Some(customer), Some(seq)) = (seen.message, seen.customer, seen.seq) {
            shipped().lock().unwrap().push((customer, seq));
        }
    }
}

/// Installs the recorder as the test binary's one global subscriber (once).
pub fn record_shipments() {
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Recorder));
}
