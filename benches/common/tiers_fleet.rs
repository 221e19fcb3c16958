//! The three-tier fleet the compare harness (`benches/compare/tiers.rs`) and the pull-mode
//! benchmark (`benches/pull_scale.rs`) both roll: its tiers' sizes and each host's seeded
//! waits, the same host for host on every run and every machine.

/// The seed of the waits.
pub const SEED: u64 = 16;
/// A wait is uniform in [`WAIT_MIN_MS`, `WAIT_MIN_MS + WAIT_SPAN_MS`) …
pub const WAIT_MIN_MS: u64 = 200;
pub const WAIT_SPAN_MS: u64 = 400;
/// … and a host is a straggler with this probability: both its waits `STRAGGLER_FACTOR` times
/// longer.
pub const STRAGGLER_P: f64 = 0.05;
pub const STRAGGLER_FACTOR: u64 = 8;

/// Hosts per tier for a fleet of `n`: 5 % db, 20 % web (at least one of each), the rest api;
/// 10, 150 and 40 at N = 200.
pub fn layout(n: usize) -> [usize; 3] {
    let db = (n / 20).max(1);
    let web = (n / 5).max(1);
    [db, n.saturating_sub(db + web).max(1), web]
}

/// A number in [0, 1) from (seed, i): splitmix64.
fn draw(seed: u64, i: u64) -> f64 {
    let mut z = seed
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The waits of the host numbered `i` (from 0 across the fleet), in milliseconds: install,
/// ready, and whether it is a straggler.
pub fn waits(i: usize) -> (u64, u64, bool) {
    let i = i as u64 * 3;
    let ms = |k: u64| WAIT_MIN_MS + (draw(SEED, i + k) * WAIT_SPAN_MS as f64) as u64;
    let straggler = draw(SEED, i + 2) < STRAGGLER_P;
    let factor = if straggler { STRAGGLER_FACTOR } else { 1 };
    (ms(0) * factor, ms(1) * factor, straggler)
}
