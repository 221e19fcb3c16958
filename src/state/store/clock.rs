//! The lease's clock: a moment by two clocks, so that time this machine spends suspended
//! counts. `Instant` is CLOCK_MONOTONIC on Linux, which stops while the machine sleeps (a laptop
//! lid, a VM paused); etcd's lease runs on regardless. CLOCK_BOOTTIME goes on through a
//! suspend; the time since a [`Stamp`] is the larger of the two clocks' (where there is no
//! such clock, the monotonic one's alone).

use std::time::{Duration, Instant};

/// A moment, by the monotonic clock and by the boot clock.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    mono: Instant,
    boot: Option<Duration>,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp {
            mono: Instant::now(),
            boot: since_boot(),
        }
    }

    /// The time since this moment, a suspend of the machine included.
    pub fn elapsed(&self) -> Duration {
        let mono = self.mono.elapsed();
        match (self.boot, since_boot()) {
            (Some(then), Some(now)) => mono.max(now.saturating_sub(then)),
            _ => mono,
        }
    }
}

/// The time since the machine booted, its suspends included (CLOCK_BOOTTIME).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn since_boot() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the one timespec it is given, which lives through the call.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0;
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec).ok()?;
    ok.then(|| Duration::new(secs, nanos))
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn since_boot() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_since_a_stamp_is_counted_by_the_boot_clock_too() {
        let s = Stamp::now();
        std::thread::sleep(Duration::from_millis(30));
        let e = s.elapsed();
        assert!(e >= Duration::from_millis(30), "{e:?}");
        assert!(since_boot().is_some(), "CLOCK_BOOTTIME on Linux");
        // A stamp whose boot clock reading is older than its monotonic one by `gap` (as after a
        // suspend that long: ten minutes, or less on a machine booted since): that much time
        // has passed, whatever the monotonic clock says.
        let boot = since_boot().unwrap_or_default();
        let gap = Duration::from_secs(600).min(boot.saturating_sub(Duration::from_secs(1)));
        assert!(gap >= Duration::from_secs(1), "booted {boot:?} ago");
        let slept = Stamp {
            mono: Instant::now(),
            boot: Some(boot - gap),
        };
        assert!(slept.elapsed() >= gap, "{:?} < {gap:?}", slept.elapsed());
        assert!(Stamp::now().elapsed() < Duration::from_secs(1));
    }
}
