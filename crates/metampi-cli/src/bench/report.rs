//! Result rows, statistics, and the table/JSON/CSV forms.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::measure::Op;

/// Percentiles of per-iteration times, in microseconds.
pub struct Stats {
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Stats {
    pub fn from_seconds(t: &[f64]) -> Stats {
        // Nanosecond resolution, 3 significant digits: enough for any MPI timing.
        let mut h = Histogram::<u64>::new(3).expect("3 significant digits is a valid precision");
        for &s in t {
            let _ = h.record((s * 1e9).max(1.0) as u64);
        }
        let us = |ns: u64| ns as f64 / 1e3;
        Stats {
            min: us(h.min()),
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            max: us(h.max()),
            mean: h.mean() / 1e3,
        }
    }
}

/// One measured point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub op: String,
    pub bytes: usize,
    pub iterations: usize,
    pub min_us: f64,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// Megabytes (1e6) per second from the median time, for bandwidth operations.
    pub mbps: Option<f64>,
}

impl Row {
    pub fn new(op: Op, bytes: usize, iterations: usize, s: &Stats) -> Row {
        Row {
            op: op.name().to_string(),
            bytes,
            iterations,
            min_us: s.min,
            median_us: s.p50,
            p90_us: s.p90,
            p99_us: s.p99,
            max_us: s.max,
            mean_us: s.mean,
            mbps: op.is_bandwidth().then(|| {
                let factor = if op == Op::BiBw { 2.0 } else { 1.0 };
                factor * bytes as f64 / s.p50.max(1e-9)
            }),
        }
    }
}

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    pub tool: String,
    pub version: String,
    pub label: String,
    pub ranks: i32,
    pub pair: (i32, i32),
    pub transport: String,
    /// The machine's ranks outnumbered their cores, so waiting ranks yielded.
    #[serde(default)]
    pub oversubscribed: bool,
    /// Receive buffers started this many bytes past a page boundary (`--misalign`).
    #[serde(default)]
    pub misalign: usize,
    /// Thread pairs of `pingpong_mt` (`--threads`), where it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    pub results: Vec<Row>,
}

impl BenchReport {
    pub fn new(
        ranks: i32,
        label: Option<String>,
        pair: (i32, i32),
        oversubscribed: bool,
    ) -> BenchReport {
        let transport = if std::env::var("METAMPI_FORCE_TCP").as_deref() == Ok("1") {
            "tcp"
        } else {
            "auto"
        };
        BenchReport {
            tool: "metampi bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            label: label.unwrap_or_else(|| format!("metampi {transport}")),
            ranks,
            pair,
            transport: transport.into(),
            oversubscribed,
            misalign: 0,
            threads: None,
            results: Vec::new(),
        }
    }

    pub fn print_header(&self) {
        println!(
            "# metampi bench {}: {} ranks, transport {}, label `{}`, waiting: {}",
            self.version,
            self.ranks,
            self.transport,
            self.label,
            if self.oversubscribed {
                "yield (ranks outnumber their cores)"
            } else {
                "spin (a core per rank)"
            }
        );
        if self.misalign != 0 {
            println!(
                "# receive buffers start {} bytes past a page boundary",
                self.misalign
            );
        }
    }

    pub fn print_op_header(&self, op: Op) {
        let who = if matches!(op, Op::PingPong | Op::PingPing | Op::Bw | Op::BiBw) {
            format!("ranks {} and {}", self.pair.0, self.pair.1)
        } else {
            format!("{} ranks", self.ranks)
        };
        println!("\n# {} ({who})", op.name());
        println!(
            "# {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "bytes", "iters", "min(us)", "median(us)", "p90(us)", "p99(us)", "max(us)", "MB/s"
        );
    }

    pub fn print_row(&self, r: &Row) {
        let mbps = r
            .mbps
            .map_or_else(|| "-".to_string(), |m| format!("{m:.1}"));
        println!(
            "  {:>10} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10}",
            r.bytes, r.iterations, r.min_us, r.median_us, r.p90_us, r.p99_us, r.max_us, mbps
        );
    }

    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "label,op,bytes,iterations,min_us,median_us,p90_us,p99_us,max_us,mean_us,mbps\n",
        );
        for r in &self.results {
            s.push_str(&format!(
                "{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{}\n",
                self.label,
                r.op,
                r.bytes,
                r.iterations,
                r.min_us,
                r.median_us,
                r.p90_us,
                r.p99_us,
                r.max_us,
                r.mean_us,
                r.mbps.map_or(String::new(), |m| format!("{m:.2}"))
            ));
        }
        s
    }
}
