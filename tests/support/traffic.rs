//! A client sending requests to a load balancer without pause while something runs, and what
//! it saw (tests/it/haproxy.rs, tests/it/drain.rs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a client saw through haproxy: answers by body (`<host> <version>`), and failures.
#[derive(Default)]
pub struct Seen {
    pub ok: usize,
    pub failed: Vec<String>,
    pub bodies: std::collections::BTreeMap<String, usize>,
}

/// Sends GET / to `addr` without pause until `stop` (at most 120 s), one connection each.
fn client(addr: SocketAddr, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let until = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let result = (|| -> std::io::Result<String> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET / HTTP/1.0\r\nHost: lb\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        })();
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(text) if text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200") => {
                seen.ok += 1;
                let body = text
                    .split("\r\n\r\n")
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string();
                *seen.bodies.entry(body).or_default() += 1;
            }
            Ok(text) => seen
                .failed
                .push(text.lines().next().unwrap_or("empty answer").to_string()),
            Err(e) => seen.failed.push(e.to_string()),
        }
        drop(seen);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `during` while a client sends requests through haproxy; what it saw.
pub fn with_traffic(addr: SocketAddr, during: impl FnOnce()) -> Seen {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let worker = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || client(addr, stop, seen))
    };
    std::thread::sleep(Duration::from_millis(200));
    during();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("client thread");
    Arc::try_unwrap(seen)
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .unwrap_or_default()
}
