//! Processes the tests start, seen from outside.

/// Whether the process is gone: no such process, or a zombie nobody reaped yet (it runs no
/// more; orphans are reaped by init, which in a container may never do it).
pub fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}
