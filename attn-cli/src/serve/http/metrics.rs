//! `GET /metrics`: Prometheus text from the `metrics` facade, rendered from a handle (no
//! listener of its own).
//!
//! * `attn_http_requests_total{route, status}`: answers by route and status (`499`: the client
//!   went away first).
//! * `attn_http_request_duration_seconds{route}`: end-to-end latency histogram.
//! * `attn_http_requests_in_flight`: requests being answered.
//! * `attn_queue_sentences`, `attn_running_rows`, `attn_tokens_generated_total`: the engine's
//!   gauges and counter ([`super::super::backend::Stats`]).

use super::super::backend::Stats;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;

/// Requests answered, by route and status.
pub const REQUESTS: &str = "attn_http_requests_total";
/// End-to-end latency in seconds, by route.
pub const DURATION: &str = "attn_http_request_duration_seconds";
/// Requests in flight.
pub const IN_FLIGHT: &str = "attn_http_requests_in_flight";

const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The process's Prometheus handle: the first call installs the recorder (one per process;
/// if another recorder was installed first, a detached one renders an empty page).
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = || {
                PrometheusBuilder::new()
                    .set_buckets_for_metric(Matcher::Full(DURATION.to_string()), BUCKETS)
                    .expect("the buckets are not empty")
            };
            builder()
                .install_recorder()
                .unwrap_or_else(|_| builder().build_recorder().handle())
        })
        .clone()
}

/// Keeps the histograms drained while nobody scrapes (runs until aborted).
pub async fn upkeep(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}

/// Records one answer.
pub fn record(route: &'static str, status: u16, seconds: f64) {
    metrics::counter!(REQUESTS, "route" => route, "status" => status.to_string()).increment(1);
    metrics::histogram!(DURATION, "route" => route).record(seconds);
}

/// The page: the engine's gauges set from `stats` first.
pub fn render(handle: &PrometheusHandle, stats: Stats) -> String {
    metrics::gauge!("attn_queue_sentences").set(stats.queued_sentences as f64);
    metrics::gauge!("attn_running_rows").set(stats.running_rows as f64);
    metrics::counter!("attn_tokens_generated_total").absolute(stats.tokens_generated);
    handle.render()
}

/// Counts a request in flight until dropped; if dropped before [`InFlight::done`], the client
/// went away: recorded as status 499.
pub struct InFlight {
    route: &'static str,
    start: std::time::Instant,
    done: bool,
}

impl InFlight {
    /// Starts counting.
    pub fn start(route: &'static str) -> Self {
        metrics::gauge!(IN_FLIGHT).increment(1.0);
        Self {
            route,
            start: std::time::Instant::now(),
            done: false,
        }
    }

    /// The request was answered with `status`; returns the seconds it took.
    pub fn done(mut self, status: u16) -> f64 {
        self.done = true;
        let secs = self.start.elapsed().as_secs_f64();
        record(self.route, status, secs);
        secs
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(IN_FLIGHT).decrement(1.0);
        if !self.done {
            record(self.route, 499, self.start.elapsed().as_secs_f64());
            tracing::info!(route = self.route, "client went away before the answer");
        }
    }
}
