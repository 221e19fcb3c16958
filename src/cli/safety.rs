//! Per-run relaxations of the platform's safety settings, asked for on the command line.

use crate::site::{Site, Transport};

/// `--accept-new-host-keys`: hosts whose key is not yet in known_hosts are accepted and their
/// key recorded (OpenSSH's `accept-new`); a changed key is still refused. For first contact
/// only: without the flag, an unknown key fails the host with a message saying what to run.
pub fn accept_new_host_keys(site: &mut Site, accept: bool) {
    if let Transport::Ssh(options) = &mut site.platform.transport {
        options.accept_new_host_keys = accept;
    }
}
