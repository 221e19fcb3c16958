//! What the benchmarks share: the median of their runs and the machine's load.

use std::borrow::Borrow;

/// The median of the finite values (NaN where there are none): a run that measured nothing
/// (NaN) is left out rather than sorted to one end.
pub fn median<T: Borrow<f64>>(values: impl IntoIterator<Item = T>) -> f64 {
    let mut v: Vec<f64> = values
        .into_iter()
        .map(|x| *x.borrow())
        .filter(|x| x.is_finite())
        .collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// The 1-minute load average (`/proc/loadavg`), NaN where it cannot be read.
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}
