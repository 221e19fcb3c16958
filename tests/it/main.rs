//! Drover's integration tests, one test program with a module per feature: the CLI run as users
//! run it (`deploy` built by cargo) and the library's stages, against real sshd fleets on
//! loopback addresses, a real etcd, haproxy and moto (`tests/support/`). One program links once
//! and compiles the support code once (it was 37 programs, each compiling `tests/support`
//! again); its tests run two at a time, as each program's did. Run one feature's tests with
//! `cargo test --features etcd --test it store_faults::` (a module's name is its file's).

#[path = "../support/mod.rs"]
mod support;

mod apply;
mod apply_stage;
mod check;
mod connections;
mod desired;
mod direct;
mod drain;
mod ec2;
mod failure;
mod fencing;
mod fleet;
mod flow;
mod full_disk;
mod fuzz_regressions;
mod graph;
mod haproxy;
mod init;
mod inventory;
mod kill_points;
mod login_shell;
mod one_connection;
mod one_connection_data;
mod plan;
mod plan_as_read;
mod plan_diff;
mod progress_deadline;
mod publish;
mod pull;
mod pull_fencing;
mod pull_policies;
mod pull_scale;
mod recovery;
mod removal;
mod repair;
mod revert;
mod rounds;
mod safety;
mod selectors;
mod stable;
mod status;
mod store;
mod store_cluster;
mod store_faults;
mod store_intents;
mod store_mirror;
mod store_takeover;
mod templates;
mod undo;
mod unread;
