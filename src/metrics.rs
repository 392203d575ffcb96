//! The process's counters and histograms, as `icestage serve` shows them at
//! `GET /metrics` in Prometheus' text format (version 0.0.4).
//!
//! Recording is a map update under a lock, cheap next to the catalog
//! round trip each recorded event is; the shell and embedders record the
//! same events and never show them. Every label value comes from a closed
//! set (a route template, a status code, a state, a configured name), so
//! the number of series is bounded by the configuration, never by a
//! client's input.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Mutex, OnceLock};

/// The upper bounds of the latency histograms, in seconds.
const SECONDS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// Label pairs, in the order given.
type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    series: BTreeMap<Labels, Series>,
}

#[derive(Debug, Default)]
struct Series {
    /// A counter's or gauge's value; a histogram's sum.
    value: f64,
    /// A histogram's count per bucket of [`SECONDS`] (not cumulative).
    buckets: [u64; SECONDS.len()],
    /// A histogram's number of observations.
    count: u64,
}

fn families() -> &'static Mutex<BTreeMap<&'static str, Family>> {
    static FAMILIES: OnceLock<Mutex<BTreeMap<&'static str, Family>>> = OnceLock::new();
    FAMILIES.get_or_init(Default::default)
}

fn with_series(
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &[(&'static str, &str)],
    update: impl FnOnce(&mut Series),
) {
    let mut families = families().lock().unwrap_or_else(|e| e.into_inner());
    let family = families.entry(name).or_insert_with(|| Family {
        help,
        kind,
        series: BTreeMap::new(),
    });
    let labels: Labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
    update(family.series.entry(labels).or_default());
}

/// Adds `by` to the counter `name` with `labels`.
pub(crate) fn count(
    name: &'static str,
    help: &'static str,
    labels: &[(&'static str, &str)],
    by: f64,
) {
    with_series(name, help, Kind::Counter, labels, |s| s.value += by);
}

/// Sets the gauge `name` with `labels` to `value`.
pub(crate) fn set(
    name: &'static str,
    help: &'static str,
    labels: &[(&'static str, &str)],
    value: f64,
) {
    with_series(name, help, Kind::Gauge, labels, |s| s.value = value);
}

/// Records `seconds` in the histogram `name` with `labels`.
pub(crate) fn observe(
    name: &'static str,
    help: &'static str,
    labels: &[(&'static str, &str)],
    seconds: f64,
) {
    with_series(name, help, Kind::Histogram, labels, |s| {
        s.value += seconds;
        s.count += 1;
        if let Some(bucket) = SECONDS.iter().position(|bound| seconds <= *bound) {
            s.buckets[bucket] += 1;
        }
    });
}

/// What a state change belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    Upload,
    Download,
}

impl Session {
    fn name(self) -> &'static str {
        match self {
            Self::Upload => "upload",
            Self::Download => "download",
        }
    }
}

/// Where state changes are reported besides the counters (the service's
/// log); nowhere until one is set.
static ON_TRANSITION: OnceLock<fn(&str, &str, &str)> = OnceLock::new();

/// Reports every later state change to `hook` (kind, id, state) too; the
/// first call wins.
pub(crate) fn on_transition(hook: fn(&str, &str, &str)) {
    let _ = ON_TRANSITION.set(hook);
}

/// Session `id` of `kind` reached `state` (`created`, `promoted`, `ready`,
/// ...): counted by state, and reported to the hook.
pub(crate) fn transition(kind: Session, id: &str, state: &str) {
    let (name, help) = match kind {
        Session::Upload => (
            "icestage_uploads_total",
            "Upload state changes this process made, by the state reached.",
        ),
        Session::Download => (
            "icestage_downloads_total",
            "Download state changes this process made, by the state reached.",
        ),
    };
    count(name, help, &[("state", state)], 1.0);
    if let Some(hook) = ON_TRANSITION.get() {
        hook(kind.name(), id, state);
    }
}

/// A label value escaped as the text format wants it.
fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn label_text(labels: &Labels, extra: Option<(&str, &str)>) -> String {
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escaped(v)))
        .collect();
    if let Some((k, v)) = extra {
        pairs.push(format!("{k}=\"{v}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// Everything recorded so far, in Prometheus' text format.
pub fn render() -> String {
    let families = families().lock().unwrap_or_else(|e| e.into_inner());
    let mut out = String::new();
    for (name, family) in families.iter() {
        let _ = writeln!(out, "# HELP {name} {}", family.help);
        let _ = writeln!(out, "# TYPE {name} {}", family.kind.name());
        for (labels, series) in &family.series {
            if family.kind != Kind::Histogram {
                let _ = writeln!(out, "{name}{} {}", label_text(labels, None), series.value);
                continue;
            }
            let mut cumulative = 0;
            for (bound, count) in SECONDS.iter().zip(series.buckets) {
                cumulative += count;
                let le = bound.to_string();
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {cumulative}",
                    label_text(labels, Some(("le", &le)))
                );
            }
            let _ = writeln!(
                out,
                "{name}_bucket{} {}",
                label_text(labels, Some(("le", "+Inf"))),
                series.count
            );
            let _ = writeln!(
                out,
                "{name}_sum{} {}",
                label_text(labels, None),
                series.value
            );
            let _ = writeln!(
                out,
                "{name}_count{} {}",
                label_text(labels, None),
                series.count
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters add, histograms fill their cumulative buckets, and label
    /// values are escaped.
    #[test]
    fn the_text_format_holds_what_was_recorded() {
        count("test_events_total", "Events.", &[("kind", "a\"b")], 1.0);
        count("test_events_total", "Events.", &[("kind", "a\"b")], 2.0);
        observe("test_latency_seconds", "Latency.", &[("route", "/x")], 0.02);
        observe("test_latency_seconds", "Latency.", &[("route", "/x")], 7.0);
        set("test_level", "Level.", &[], 4.0);
        let text = render();
        for line in [
            "# TYPE test_events_total counter",
            "test_events_total{kind=\"a\\\"b\"} 3",
            "test_latency_seconds_bucket{route=\"/x\",le=\"0.01\"} 0",
            "test_latency_seconds_bucket{route=\"/x\",le=\"0.025\"} 1",
            "test_latency_seconds_bucket{route=\"/x\",le=\"10\"} 2",
            "test_latency_seconds_bucket{route=\"/x\",le=\"+Inf\"} 2",
            "test_latency_seconds_count{route=\"/x\"} 2",
            "test_latency_seconds_sum{route=\"/x\"} 7.02",
            "test_level 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }
}
