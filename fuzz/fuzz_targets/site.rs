//! Any bytes as a site file, beside a fixed platform and policy: `drover::site::load` must
//! report problems, never panic (nor hang, nor exhaust memory).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    drover::fuzzing::site(data);
});
