//! Enhanced fan-out subscriptions spread over several HTTP/2 connections.
//!
//! Over HTTP/2 one SDK client multiplexes every call onto one connection, and a server caps
//! the streams open at once on a connection (`SETTINGS_MAX_CONCURRENT_STREAMS`). A
//! subscription holds its stream for up to five minutes, so past the cap the client queues the
//! next subscriptions behind the open ones: at 1,000 shards they waited a minute or more and
//! timed out. The subscriptions are therefore spread over *lanes*: SDK clients that share the
//! configuration (credentials, endpoint, HTTP client, retries) but not the connection, each
//! carrying at most [`DEFAULT_PER_CONNECTION`] open subscriptions, the value RFC 9113 (5.1.2)
//! recommends a server allow at least. The first lane is the transport's own client.
//!
//! A lane gets a connection of its own because the SDK's HTTP client (its default, and any
//! built with `aws-smithy-http-client`) keeps one connector, and with it one connection pool,
//! per set of connector settings: each further lane asks for a connect timeout a nanosecond
//! longer than the one before. An HTTP client of the application's own that ignores the
//! settings keeps one connection for every lane, as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::timeout::TimeoutConfig;

/// How many subscriptions one connection carries at most, by default.
pub(crate) const DEFAULT_PER_CONNECTION: usize = 100;

/// The connect timeout the SDK uses when its configuration sets none.
const SDK_CONNECT_TIMEOUT: Duration = Duration::from_millis(3_100);

/// The lane a new subscription takes: the least loaded one with room, or `None` when every
/// lane carries `per_connection` subscriptions (open another).
pub(crate) fn pick(active: &[usize], per_connection: usize) -> Option<usize> {
    active
        .iter()
        .enumerate()
        .filter(|(_, n)| **n < per_connection)
        .min_by_key(|(_, n)| **n)
        .map(|(lane, _)| lane)
}

/// One client and the subscriptions open on it.
struct Lane {
    client: Client,
    active: Arc<AtomicUsize>,
}

/// The lanes of one transport.
pub(crate) struct Lanes {
    lanes: Mutex<Vec<Lane>>,
    per_connection: usize,
}

/// A subscription's place on its lane; leaving it (dropping) frees the place.
pub(crate) struct Seat(Arc<AtomicUsize>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Lanes {
    /// Lanes beginning with the transport's own `client`, `per_connection` subscriptions each.
    pub(crate) fn new(client: Client, per_connection: usize) -> Self {
        Self {
            lanes: Mutex::new(vec![Lane {
                client,
                active: Arc::default(),
            }]),
            per_connection: per_connection.max(1),
        }
    }

    /// The client a new subscription uses, and its seat on it (taken at once, so subscriptions
    /// asked for together spread out).
    pub(crate) fn seat(&self) -> (Client, Seat) {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let active: Vec<usize> = lanes
            .iter()
            .map(|l| l.active.load(Ordering::Acquire))
            .collect();
        let index = pick(&active, self.per_connection).unwrap_or_else(|| {
            let client = another(&lanes[0].client, lanes.len());
            tracing::debug!(
                lanes = lanes.len() + 1,
                per_connection = self.per_connection,
                "every fan-out connection is full: opening another"
            );
            lanes.push(Lane {
                client,
                active: Arc::default(),
            });
            lanes.len() - 1
        });
        let lane = &lanes[index];
        lane.active.fetch_add(1, Ordering::AcqRel);
        (lane.client.clone(), Seat(lane.active.clone()))
    }

    /// How many lanes are open (each a connection of its own over HTTP/2).
    pub(crate) fn count(&self) -> usize {
        self.lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A client like `first` whose connect timeout is `lane` nanoseconds longer, so the HTTP
/// client gives it a connector (and a connection pool) of its own.
fn another(first: &Client, lane: usize) -> Client {
    let config = first.config();
    let base = config
        .timeout_config()
        .and_then(TimeoutConfig::connect_timeout)
        .unwrap_or(SDK_CONNECT_TIMEOUT);
    let mut timeouts = config
        .timeout_config()
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build())
        .to_builder();
    let nanos = u64::try_from(lane).unwrap_or(u64::MAX);
    timeouts.set_connect_timeout(Some(base + Duration::from_nanos(nanos)));
    let config = config.to_builder().timeout_config(timeouts.build()).build();
    Client::from_conf(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_lane_with_room_is_picked() {
        assert_eq!(pick(&[0], 100), Some(0));
        assert_eq!(pick(&[100], 100), None);
        assert_eq!(pick(&[100, 40, 12], 100), Some(2));
        assert_eq!(pick(&[99, 100], 100), Some(0));
        assert_eq!(pick(&[3, 3], 3), None);
    }

    #[test]
    fn seats_fill_lanes_and_free_them_when_dropped() {
        let conf = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .build();
        let lanes = Lanes::new(Client::from_conf(conf), 2);
        let seats: Vec<Seat> = (0..5).map(|_| lanes.seat().1).collect();
        assert_eq!(lanes.count(), 3);
        drop(seats);
        let _again: Vec<Seat> = (0..6).map(|_| lanes.seat().1).collect();
        assert_eq!(lanes.count(), 3, "freed seats are taken again");
    }

    #[test]
    fn another_lane_asks_for_its_own_connector() {
        let conf = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(2))
                    .operation_timeout(Duration::from_secs(9))
                    .build(),
            )
            .build();
        let first = Client::from_conf(conf);
        let second = another(&first, 3);
        let timeouts = second.config().timeout_config().unwrap();
        assert_eq!(
            timeouts.connect_timeout(),
            Some(Duration::from_secs(2) + Duration::from_nanos(3))
        );
        assert_eq!(timeouts.operation_timeout(), Some(Duration::from_secs(9)));
    }
}
