//! Latency histograms and the percentiles we report from them.
//!
//! Latencies are recorded in microseconds in an HDR histogram with three
//! significant digits, so a reported percentile is within 0.1% of the true
//! value; anything above a minute is clamped to a minute.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The largest latency recorded exactly, in microseconds (one minute).
const HIGHEST_US: u64 = 60_000_000;

/// An empty latency histogram in microseconds.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("static histogram bounds are valid")
}

/// Adds one latency to `h`.
pub fn record(h: &mut Histogram<u64>, latency: Duration) {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    h.saturating_record(us.clamp(1, HIGHEST_US));
}

/// The percentiles of a run, in milliseconds (0 when nothing was recorded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// The slowest request.
    pub max_ms: f64,
}

impl Percentiles {
    /// Reads the percentiles off a histogram in microseconds.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            p50_ms: ms(h.value_at_quantile(0.50)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn percentiles_of_a_known_histogram() {
        let mut h = histogram();
        for us in 1..=10_000u64 {
            record(&mut h, Duration::from_micros(us));
        }
        let p = Percentiles::of(&h);
        assert!(close(p.p50_ms, 5.0), "{p:?}");
        assert!(close(p.p99_ms, 9.9), "{p:?}");
        assert!(close(p.p999_ms, 9.99), "{p:?}");
        assert!(close(p.max_ms, 10.0), "{p:?}");
    }

    #[test]
    fn a_tail_shows_only_in_the_high_percentiles() {
        let mut h = histogram();
        for _ in 0..990 {
            record(&mut h, Duration::from_millis(1));
        }
        for _ in 0..10 {
            record(&mut h, Duration::from_millis(200));
        }
        let p = Percentiles::of(&h);
        assert!(close(p.p50_ms, 1.0), "{p:?}");
        assert!(close(p.p99_ms, 1.0), "{p:?}");
        assert!(close(p.p999_ms, 200.0), "{p:?}");
    }

    #[test]
    fn empty_and_out_of_range() {
        assert_eq!(Percentiles::of(&histogram()), Percentiles::default());
        let mut h = histogram();
        record(&mut h, Duration::ZERO);
        record(&mut h, Duration::from_secs(3600));
        assert_eq!(h.len(), 2);
        assert!(close(Percentiles::of(&h).max_ms, 60_000.0));
    }
}
