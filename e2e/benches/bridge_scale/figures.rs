//! The bench's figures: each one a JSON line on stdout as it is measured, then all of them
//! as a table; and the statistics behind them (mean, p50, p99, max; a phase's pods/s).
//! Apart from `main.rs` because it is how results are reported, not how they are made.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::BENCH;
use crate::pods::Seen;

/// A figure: name, value, unit, target, met.
type Figure = (
    String,
    serde_json::Value,
    String,
    Option<String>,
    Option<bool>,
);

/// One figure as a JSON line on stdout; also kept for the table.
pub struct Figures(pub Vec<Figure>);

impl Figures {
    pub fn add(
        &mut self,
        name: &str,
        value: serde_json::Value,
        unit: &str,
        target: Option<&str>,
        met: Option<bool>,
    ) {
        println!(
            "{}",
            json!({"bench": BENCH, "name": name, "value": value, "unit": unit,
                   "target": target, "met": met})
        );
        self.0.push((
            name.to_owned(),
            value,
            unit.to_owned(),
            target.map(str::to_owned),
            met,
        ));
    }

    pub fn table(&self) {
        println!();
        println!("| figure | value | unit | target | met |");
        println!("|---|---:|---|---|---|");
        for (name, value, unit, target, met) in &self.0 {
            let met = match met {
                Some(true) => "yes",
                Some(false) => "no",
                None => "",
            };
            println!(
                "| {name} | {value} | {unit} | {} | {met} |",
                target.as_deref().unwrap_or("")
            );
        }
    }
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Mean, p50, p99 and max of `v` (sorted here), in ms.
pub fn stats(v: &mut [Duration]) -> Option<(f64, f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let pick = |q: f64| {
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        ms(v[i])
    };
    let total: Duration = v.iter().sum();
    let mean = ms(total / u32::try_from(v.len()).unwrap_or(u32::MAX));
    Some((mean, pick(0.50), pick(0.99), pick(1.0)))
}

/// The figures of one phase: pods/s (the target applies to bursts only) and the latency
/// statistics.
pub fn report_phase(
    figs: &mut Figures,
    phase: &str,
    created: &HashMap<String, Instant>,
    seen: &Seen,
    all_bound: bool,
    burst: bool,
) {
    let first = created.values().min().copied();
    let mut lat: Vec<Duration> = Vec::new();
    let mut last: Option<Instant> = None;
    for (name, at) in created {
        if let Some((b, _)) = seen.bound.get(name) {
            lat.push(b.saturating_duration_since(*at));
            last = Some(last.map_or(*b, |l: Instant| l.max(*b)));
        }
    }
    let bound = lat.len();
    figs.add(
        &format!("{phase}_pods_bound"),
        json!(bound),
        "pods",
        Some(&format!("{}", created.len())),
        Some(all_bound && bound == created.len()),
    );
    let rate = match (first, last) {
        (Some(f), Some(l)) if bound > 0 => {
            let s = l.saturating_duration_since(f).as_secs_f64();
            Some(((bound as f64 / s.max(1e-9)) * 10.0).round() / 10.0)
        }
        _ => None,
    };
    let (target, met) = if burst {
        (Some(">= 1000"), Some(rate.is_some_and(|r| r >= 1000.0)))
    } else {
        (None, None)
    };
    figs.add(
        &format!("{phase}_pods_per_s"),
        json!(rate),
        "pods/s",
        target,
        met,
    );
    if let Some((mean, p50, p99, max)) = stats(&mut lat) {
        figs.add(
            &format!("{phase}_latency_mean"),
            json!(mean),
            "ms",
            None,
            None,
        );
        figs.add(
            &format!("{phase}_latency_p50"),
            json!(p50),
            "ms",
            None,
            None,
        );
        figs.add(
            &format!("{phase}_latency_p99"),
            json!(p99),
            "ms",
            Some("< 100"),
            Some(p99 < 100.0),
        );
        figs.add(
            &format!("{phase}_latency_max"),
            json!(max),
            "ms",
            None,
            None,
        );
    }
}
