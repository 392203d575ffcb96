//! Request rates: a token bucket per authenticated caller (an API token,
//! a session), and apart from them a bucket per client address for callers
//! that have not authenticated. A request is charged to a caller's bucket
//! only once its token was checked; a failed authentication is charged to
//! its address. So a stranger can spend, evict or block only its own
//! address's bucket, never a caller's: made-up session ids or wrong secrets
//! for a victim's upload do not slow the victim down, and however many
//! strangers come, every caller keeps its bucket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;

/// Addresses whose buckets are kept before idle ones are dropped; past it,
/// a new address waits (only strangers do: callers never share this map).
const MAX_STRANGERS: usize = 10_000;

tokio::task_local! {
    /// The client address of the request being served, when the server
    /// was started with connection info.
    static PEER: Option<IpAddr>;
}

/// Middleware: makes the request's client address known to [`peer`].
pub(crate) async fn with_peer(request: Request, next: Next) -> Response {
    let address = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip());
    PEER.scope(address, next.run(request)).await
}

/// The address of the request being served (`unknown` in a router served
/// without connection info, e.g. in-process tests).
fn peer() -> String {
    PEER.try_with(|p| p.map(|a| a.to_string()))
        .ok()
        .flatten()
        .unwrap_or_else(|| "unknown".to_string())
}

/// One bucket: tokens left, and when it was last filled.
type Bucket = (f64, Instant);

/// See the module documentation.
pub(crate) struct Limiter {
    /// Requests a minute, per bucket.
    rate: f64,
    callers: Mutex<HashMap<String, Bucket>>,
    strangers: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    pub(crate) fn new(requests_per_minute: u32) -> Self {
        Self {
            rate: f64::from(requests_per_minute.max(1)),
            callers: Mutex::default(),
            strangers: Mutex::default(),
        }
    }

    /// `bucket` filled up to now; `Some(seconds)` to wait when it holds no
    /// whole request.
    fn refill(&self, bucket: &mut Bucket) -> Option<u64> {
        let now = Instant::now();
        bucket.0 = (bucket.0 + now.duration_since(bucket.1).as_secs_f64() * self.rate / 60.0)
            .min(self.rate);
        bucket.1 = now;
        (bucket.0 < 1.0).then(|| (((1.0 - bucket.0) * 60.0 / self.rate).ceil() as u64).max(1))
    }

    /// Takes one request from the authenticated caller `key`'s bucket;
    /// `Some(seconds to wait)` when it is empty. Call only once `key`'s
    /// token was checked.
    pub(crate) fn admit(&self, key: &str) -> Option<u64> {
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        if callers.len() >= MAX_STRANGERS && !callers.contains_key(key) {
            // A bucket idle for a minute is full again: it can go.
            callers.retain(|_, (_, last)| last.elapsed() < Duration::from_secs(60));
        }
        let bucket = callers
            .entry(key.to_string())
            .or_insert((self.rate, Instant::now()));
        let wait = self.refill(bucket);
        if wait.is_none() {
            bucket.0 -= 1.0;
        } else {
            refusal("caller");
        }
        wait
    }

    /// `Some(seconds to wait)` when this request's address has spent its
    /// bucket on failed authentications: checked, not charged, before a
    /// token is looked at.
    pub(crate) fn stranger_wait(&self) -> Option<u64> {
        let mut strangers = self.strangers.lock().unwrap_or_else(|e| e.into_inner());
        let address = peer();
        let full = strangers.len() >= MAX_STRANGERS;
        let wait = match strangers.get_mut(&address) {
            Some(bucket) => self.refill(bucket),
            None if full => {
                strangers.retain(|_, (_, last)| last.elapsed() < Duration::from_secs(60));
                // More failing addresses in a minute than are tracked: a new
                // one waits.
                (strangers.len() >= MAX_STRANGERS).then_some(1)
            }
            None => None,
        };
        if wait.is_some() {
            refusal("address");
        }
        wait
    }

    /// Charges a failed authentication to this request's address.
    pub(crate) fn refused(&self) {
        let mut strangers = self.strangers.lock().unwrap_or_else(|e| e.into_inner());
        if strangers.len() >= MAX_STRANGERS {
            strangers.retain(|_, (_, last)| last.elapsed() < Duration::from_secs(60));
            if strangers.len() >= MAX_STRANGERS {
                return;
            }
        }
        let bucket = strangers
            .entry(peer())
            .or_insert((self.rate, Instant::now()));
        self.refill(bucket);
        bucket.0 = (bucket.0 - 1.0).max(0.0);
    }
}

/// Counts one request refused by a rate limit: a `caller`'s (a token or a
/// session) or an `address`'s (failed authentications).
fn refusal(by: &str) {
    crate::metrics::count(
        "icestage_rate_limited_total",
        "Requests refused by a rate limit: a caller's, or an address's after failed authentications.",
        &[("by", by)],
        1.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_spend_their_own_bucket_and_never_a_callers() {
        let limiter = Limiter::new(10);
        // A stranger fails ten times: its address is out of requests.
        for _ in 0..10 {
            assert_eq!(limiter.stranger_wait(), None);
            limiter.refused();
        }
        assert!(limiter.stranger_wait().is_some());
        // Every caller still has its whole bucket.
        for _ in 0..10 {
            assert_eq!(limiter.admit("session u1"), None);
        }
        assert!(limiter.admit("session u1").is_some());
        assert_eq!(limiter.admit("token 'api'"), None);
    }
}
