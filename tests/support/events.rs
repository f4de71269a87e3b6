//! Records what the code under test logs: every event's message and its fields as text, so a
//! test can read back what a handler saw (`tracing::info!(field = .., "message")`). An
//! event's fields include those of the spans it was logged in (the event's own win), so a
//! test can keep to its own subscription's lines, by `application` or `owner`, while other
//! tests of the binary log beside it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event's fields, by name, as text (the message left out).
pub type Fields = BTreeMap<String, String>;

static EVENTS: Mutex<Vec<(String, Fields)>> = Mutex::new(Vec::new());

#[derive(Default)]
struct Collect {
    message: String,
    fields: Fields,
}

impl Collect {
    fn set(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.insert(field.name().to_owned(), value);
        }
    }
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field, format!("{value:?}"));
    }
}

/// A span's fields, kept in its extensions.
struct SpanFields(Fields);

struct Recorder;

impl<S> tracing_subscriber::Layer<S> for Recorder
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Collect::default();
        attrs.record(&mut seen);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(seen.fields));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut seen = Collect::default();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
                    seen.fields.extend(fields.clone());
                }
            }
        }
        event.record(&mut seen);
        EVENTS.lock().unwrap().push((seen.message, seen.fields));
    }
}

/// Installs the recorder as the test binary's one global subscriber (the first call wins;
/// a concurrent call waits until it is installed).
///
/// A callsite first hit while the subscriber is being installed (by a test running beside)
/// would keep the interest of no subscriber at all, and its events would never be recorded:
/// so the interest of every callsite is computed again once the recorder is in place.
///
/// A callsite whose registration straddles the installation can still keep the interest of
/// no subscriber (a span made disabled, so its fields never reach the events in it): every
/// call computes the interest again, so a test that calls this first sees its own spans.
pub fn record_events() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let _ =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Recorder));
    });
    tracing::callsite::rebuild_interest_cache();
}

/// The fields of every event logged with `message` so far, in order.
pub fn events(message: &str) -> Vec<Fields> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _)| m == message)
        .map(|(_, f)| f.clone())
        .collect()
}

/// Forgets the events logged with `message` for which `drop` holds.
pub fn forget(message: &str, drop: impl Fn(&Fields) -> bool) {
    EVENTS
        .lock()
        .unwrap()
        .retain(|(m, f)| m != message || !drop(f));
}

/// The fields of every event whose message starts with `prefix` so far, in order.
pub fn events_starting(prefix: &str) -> Vec<Fields> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _)| m.starts_with(prefix))
        .map(|(_, f)| f.clone())
        .collect()
}
