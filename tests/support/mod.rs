//! Shared helpers for the integration tests (`tests/it/main.rs` includes them as `support`; a
//! test program of its own would include them with `mod support;`).
#![allow(dead_code)]

pub mod cli;
pub mod etcd;
pub mod fleet;
pub mod hooks;
pub mod intervals;
pub mod moto;
pub mod process;
pub mod pull;
pub mod relay;
pub mod shop;
pub mod traffic;
