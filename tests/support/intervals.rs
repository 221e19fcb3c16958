//! Intervals of time the hosts logged (a hook's start and end): how many were open at once.
//! Used by the pull tests and by `benches/pull_scale.rs` (which includes this file).

/// The most intervals open at one instant.
pub fn most_at_once(intervals: &[(u128, u128)]) -> usize {
    let mut edges: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    // An end before a start at the same instant.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    usize::try_from(most).unwrap_or(0)
}
