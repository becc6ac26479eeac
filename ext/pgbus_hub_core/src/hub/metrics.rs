//! The hub's Prometheus metrics (docs/monitoring.md): the text exposition
//! format 0.0.4, rendered from the hub's stats fields ([`HubStats::fields`],
//! what `pgbus-hub status` shows), so a metric and its stat are one number;
//! the sub->ack time histogram; and the `GET /metrics` endpoint.
//!
//! The endpoint runs on a thread of its own (a current-thread runtime, hyper's
//! HTTP/1 server): a scrape reads the same atomics `stats` reads and never
//! waits on the hub's thread, so a slow or hostile scraper never slows a worker.
//!
//! [`HubStats::fields`]: super::HubStats::fields

use super::HubShared;
use crate::listener::ListenerState;
use crate::owned_thread::OwnedThread;
use crate::shutdown::{shutdown, Shutdown};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use prometheus::core::Metric as _;
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::TextEncoder;
use serde_json::{Map, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the endpoint listens unless told: this host only (the numbers say
/// how a host's workers are served; a scraper elsewhere is an operator's choice).
pub const DEFAULT_METRICS_BIND: &str = "127.0.0.1";

/// The endpoint's one path.
pub const METRICS_PATH: &str = "/metrics";

/// Upper bounds (seconds) of the sub->ack histogram: a LISTEN on a local
/// server acks in tens to hundreds of microseconds (docs/api.md: p50 44 µs
/// for a new channel), a remote one in a round trip or two; an ack held
/// through a database outage comes after the listener's budget
/// (`health_check_ms` + 1 s: 1.25 s by default).
pub const SUBSCRIBE_ACK_BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// A scraper that opens a connection must send its request head within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Scrape connections served at once; past it a new one is closed at once.
/// Prometheus keeps one per target: the cap only bounds the file descriptors
/// a flood of connections could take from the process the hub serves workers in.
const MAX_CONNECTIONS: usize = 16;

/// After a failed accept (EMFILE...), wait this long before the next one
/// instead of spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// `metrics_port` / `metrics_bind`: where to serve `GET /metrics` (port 0: any free one).
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    pub bind: String,
    pub port: u16,
}

/// Sub->ack times so far (stats field `subscribe_ack_seconds`): cumulative
/// counts per upper bound, the sum and the count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AckTimes {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl AckTimes {
    pub fn to_json(&self) -> Value {
        let buckets: Vec<Value> = self
            .buckets
            .iter()
            .map(|&(bound, count)| Value::from(vec![Value::from(bound), Value::from(count)]))
            .collect();
        let mut object = Map::new();
        object.insert("count".into(), self.count.into());
        object.insert("sum".into(), self.sum.into());
        object.insert("buckets".into(), buckets.into());
        object.into()
    }

    fn from_json(value: &Value) -> Option<Self> {
        let buckets = value.get("buckets")?.as_array()?;
        Some(Self {
            buckets: buckets
                .iter()
                .map(|pair| Some((pair.get(0)?.as_f64()?, pair.get(1)?.as_u64()?)))
                .collect::<Option<_>>()?,
            sum: value.get("sum")?.as_f64()?,
            count: value.get("count")?.as_u64()?,
        })
    }
}

/// The hub's sub->ack times: from a sub frame read to its ack written to
/// the worker's socket (acks only: a nack is a refusal, not a wait).
pub(crate) struct AckHistogram(prometheus::Histogram);

impl AckHistogram {
    pub(crate) fn new() -> Self {
        let options =
            prometheus::HistogramOpts::new("pgbus_hub_subscribe_ack_seconds", "sub->ack time")
                .buckets(SUBSCRIBE_ACK_BUCKETS.to_vec());
        // Constant, valid options (increasing bounds, a legal name): never an error.
        Self(prometheus::Histogram::with_opts(options).unwrap_or_else(|e| unreachable!("{e}")))
    }

    pub(crate) fn observe(&self, since: Instant) {
        self.0.observe(since.elapsed().as_secs_f64());
    }

    pub(crate) fn snapshot(&self) -> AckTimes {
        let metric = self.0.metric();
        let histogram = metric.get_histogram();
        AckTimes {
            buckets: histogram
                .get_bucket()
                .iter()
                .map(|b| (b.upper_bound(), b.cumulative_count()))
                .collect(),
            sum: histogram.get_sample_sum(),
            count: histogram.get_sample_count(),
        }
    }
}

/// Gauges: (stats field, metric, HELP). A field absent from the stats (an
/// older hub, or `census` without `--database-url`) leaves its family out.
const GAUGES: &[(&str, &str, &str)] = &[
    ("workers", "pgbus_hub_workers", "Worker connections the hub serves (a status request is not one)."),
    ("worker_processes", "pgbus_hub_worker_processes", "Processes holding those connections (distinct peer pids)."),
    ("channels", "pgbus_hub_channels", "Channels the hub LISTENs on for its workers (the host-wide LISTEN set)."),
    ("raw_channels", "pgbus_hub_raw_channels", "Of those, raw channels LISTENed verbatim (ActionCable's)."),
    ("listen_connections", "pgbus_hub_listen_connections", "The hub's LISTEN connections: 1, 2 with standby while the standby is up (2 during a handover)."),
    ("census", "pgbus_hub_census", "pgbus-listen connections from this host to the hub's database (pgbus-hub status --database-url only)."),
    ("uptime", "pgbus_hub_uptime_seconds", "Seconds since the hub started."),
];

/// Counters: (stats field, metric, HELP).
const COUNTERS: &[(&str, &str, &str)] = &[
    (
        "reconnects",
        "pgbus_hub_reconnects_total",
        "Times the LISTEN connection was lost or given up and made again.",
    ),
    (
        "handovers",
        "pgbus_hub_handovers_total",
        "Reconnects where the given-up connection handed its backlog over (nothing lost).",
    ),
    (
        "abandoned_connections",
        "pgbus_hub_abandoned_connections_total",
        "Given-up connections closed before they could hand their backlog over.",
    ),
    (
        "standby_promotions",
        "pgbus_hub_standby_promotions_total",
        "Serving LISTEN connections lost while a standby was aligned: the standby served on from where they stopped (nothing lost).",
    ),
    (
        "listener_restarts",
        "pgbus_hub_listener_restarts_total",
        "Times the LISTEN engine ended on its own and was restarted.",
    ),
    (
        "wakes_received",
        "pgbus_hub_wakes_received_total",
        "Notifications the LISTEN connection received.",
    ),
    (
        "frames_sent",
        "pgbus_hub_frames_sent_total",
        "Frames written to worker and status connections (wakes, catch-up wakes, acks, nacks, status, stats answers).",
    ),
    (
        "dropped_durable_wakes",
        "pgbus_hub_dropped_durable_wakes_total",
        "Durable wakes dropped for a worker over durable_queue_limit (its stream re-reads).",
    ),
    (
        "evicted_workers",
        "pgbus_hub_evicted_workers_total",
        "Workers cut off over hard_queue_limit (each fails over to a connection of its own).",
    ),
    (
        "rejected_peers",
        "pgbus_hub_rejected_peers_total",
        "Connections refused: another uid, or the peer's uid unknown.",
    ),
    (
        "refused_subs",
        "pgbus_hub_refused_subs_total",
        "Subs refused by max_channels_per_connection or max_channels.",
    ),
    (
        "moved_workers",
        "pgbus_hub_moved_workers_total",
        "Workers a planned stop handed over to their own connection at their markers (nothing lost, nothing twice).",
    ),
    (
        "unmoved_workers",
        "pgbus_hub_unmoved_workers_total",
        "Workers a planned stop closed without a marker (no answer to move, or the deadline): they failed over.",
    ),
];

/// The families of `stats` (a [`super::HubStats::fields`] map, with
/// `census` when the caller counted it), in the text format 0.0.4.
/// `pgbus_hub_up` is always there: 0 for an empty map (no hub answered).
pub fn render(stats: &Map<String, Value>) -> Result<String, String> {
    let healthy = stats.get("listener_healthy").and_then(Value::as_bool) == Some(true);
    let mut families = vec![family(
        "pgbus_hub_up",
        "1 while the hub's LISTEN connection is healthy (listener_healthy), else 0.",
        MetricType::GAUGE,
        vec![gauge(&[], f64::from(u8::from(healthy)))],
    )];
    if let Some(state) = stats.get("listener_state").and_then(Value::as_str) {
        let one_hot = ListenerState::ALL
            .iter()
            .map(|s| {
                let value = f64::from(u8::from(s.as_str() == state));
                gauge(&[("state", s.as_str())], value)
            })
            .collect();
        families.push(family(
            "pgbus_hub_listener_state",
            "Where the hub's LISTEN connection stands: 1 for the current state, 0 for the others.",
            MetricType::GAUGE,
            one_hot,
        ));
    }
    for &(field, name, help) in GAUGES {
        if let Some(value) = stats.get(field).and_then(Value::as_f64) {
            families.push(family(
                name,
                help,
                MetricType::GAUGE,
                vec![gauge(&[], value)],
            ));
        }
    }
    for &(field, name, help) in COUNTERS {
        if let Some(value) = stats.get(field).and_then(Value::as_f64) {
            let mut counter = proto::Counter::default();
            counter.set_value(value);
            let mut metric = proto::Metric::default();
            metric.set_counter(counter);
            families.push(family(name, help, MetricType::COUNTER, vec![metric]));
        }
    }
    if let Some(times) = stats
        .get("subscribe_ack_seconds")
        .and_then(AckTimes::from_json)
    {
        families.push(family(
            "pgbus_hub_subscribe_ack_seconds",
            "Seconds from a worker's sub frame read to its ack written (acks only).",
            MetricType::HISTOGRAM,
            vec![histogram(&times)],
        ));
    }
    let mut text = String::new();
    TextEncoder::new()
        .encode_utf8(&families, &mut text)
        .map_err(|e| format!("cannot render the metrics: {e}"))?;
    Ok(text)
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.into());
    family.set_help(help.into());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

fn gauge(labels: &[(&str, &str)], value: f64) -> proto::Metric {
    let mut gauge = proto::Gauge::default();
    gauge.set_value(value);
    let mut metric = proto::Metric::default();
    metric.set_label(
        labels
            .iter()
            .map(|&(name, value)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name(name.into());
                pair.set_value(value.into());
                pair
            })
            .collect(),
    );
    metric.set_gauge(gauge);
    metric
}

fn histogram(times: &AckTimes) -> proto::Metric {
    let mut histogram = proto::Histogram::default();
    histogram.set_sample_count(times.count);
    histogram.set_sample_sum(times.sum);
    histogram.set_bucket(
        times
            .buckets
            .iter()
            .map(|&(bound, count)| {
                let mut bucket = proto::Bucket::default();
                bucket.set_upper_bound(bound);
                bucket.set_cumulative_count(count);
                bucket
            })
            .collect(),
    );
    let mut metric = proto::Metric::default();
    metric.set_histogram(histogram);
    metric
}

/// The running endpoint: its thread and the address it got.
pub(crate) struct MetricsEndpoint {
    pub thread: OwnedThread,
    pub address: SocketAddr,
}

/// Binds `config`'s address and serves `GET /metrics` on a thread of its own.
/// A failure is the caller's to log: the hub serves its workers without it.
pub(crate) fn start(
    config: &MetricsConfig,
    shared: Arc<HubShared>,
) -> Result<MetricsEndpoint, String> {
    let where_ = format!("{}:{}", config.bind, config.port);
    let listener = std::net::TcpListener::bind((config.bind.as_str(), config.port))
        .map_err(|e| format!("cannot listen on {where_}: {e}"))?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("cannot read the address of {where_}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot make {where_} non-blocking: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the metrics runtime: {e}"))?;
    let (trigger, stop) = shutdown();
    let thread = OwnedThread::spawn(
        "pgbus-hub-metrics",
        move || trigger.trigger(),
        move || runtime.block_on(serve(listener, shared, stop)),
    )
    .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    Ok(MetricsEndpoint { thread, address })
}

async fn serve(listener: std::net::TcpListener, shared: Arc<HubShared>, mut stop: Shutdown) {
    let log = shared.log.clone();
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => return log.error(format!("metrics endpoint cannot serve its socket: {e}")),
    };
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            () = stop.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    log.warn(format!("metrics endpoint: accept failed: {e} — retrying"));
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            continue; // dropped: closed at once
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&shared, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            // A scraper that hangs up mid-request is its own business: nothing to log.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond<B>(shared: &HubShared, request: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    if request.uri().path() != METRICS_PATH {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("not found: the metrics are at {METRICS_PATH}\n"),
        );
    }
    if request.method() != Method::GET {
        let mut response = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
        response.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET"),
        );
        return response;
    }
    // The hub's thread plus this one: `threads` is not a metric, the rest is what `stats` reads.
    match render(&shared.stats(2).fields()) {
        Ok(text) => reply(StatusCode::OK, prometheus::TEXT_FORMAT, text),
        Err(e) => {
            shared.log.error(format!("metrics endpoint: {e}"));
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{e}\n"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::HubStats;

    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn without_a_hub_only_up_is_there_and_it_is_0() {
        let text = render(&Map::new()).unwrap();
        assert_eq!(samples(&text), ["pgbus_hub_up 0"]);
        assert!(text.contains("# TYPE pgbus_hub_up gauge\n"), "{text}");
    }

    #[test]
    fn every_stat_renders_under_its_name_and_the_state_is_one_hot() {
        let stats = HubStats {
            workers: 3,
            evicted_workers: 2,
            listen_connections: 2,
            standby_promotions: 1,
            subscribe_ack: AckHistogram::new().snapshot(),
            ..HubStats::default()
        };
        let text = render(&stats.fields()).unwrap();
        let samples = samples(&text);
        for line in [
            "pgbus_hub_up 0",
            "pgbus_hub_workers 3",
            "pgbus_hub_evicted_workers_total 2",
            "pgbus_hub_listen_connections 2",
            "pgbus_hub_standby_promotions_total 1",
            "pgbus_hub_listener_state{state=\"connecting\"} 1",
            "pgbus_hub_listener_state{state=\"listening\"} 0",
            "pgbus_hub_subscribe_ack_seconds_bucket{le=\"0.00005\"} 0",
            "pgbus_hub_subscribe_ack_seconds_bucket{le=\"+Inf\"} 0",
            "pgbus_hub_subscribe_ack_seconds_count 0",
        ] {
            assert!(samples.contains(&line), "{line} in {text}");
        }
        let states = samples
            .iter()
            .filter(|l| l.starts_with("pgbus_hub_listener_state{"))
            .count();
        assert_eq!(states, ListenerState::ALL.len());
        for (_, name, _) in GAUGES.iter().chain(COUNTERS) {
            assert!(
                *name == "pgbus_hub_census" || text.contains(&format!("# TYPE {name} ")),
                "{name}"
            );
        }
    }
}
