//! A fault proxy for tests: a TCP relay on loopback between `deploy` and a server (etcd) that
//! passes traffic, or, on command, silently drops it: it stops forwarding in both directions
//! without closing anything, as a partitioned network does (a killed server is a refused
//! connection, which a client notices at once; a dropped one it notices only by timing out).
//! Connections made while it drops are accepted and left silent too.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A running relay; it stops accepting when dropped (connections it made end with the test).
pub struct Relay {
    /// Where clients connect: `127.0.0.1:<port>`.
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to `upstream` (`127.0.0.1:<port>`), passing traffic.
    pub fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("relay address");
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cut.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let c = c.clone();
                std::thread::spawn(move || connect(client, upstream, c));
            }
        });
        Relay { addr, cut, stop }
    }

    /// `http://127.0.0.1:<port>`: an etcd endpoint through the relay.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, nothing is forwarded either way (nothing is closed either).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Traffic passes again (what was dropped meanwhile is lost).
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn connect(client: TcpStream, upstream: SocketAddr, cut: Arc<AtomicBool>) {
    if cut.load(Ordering::SeqCst) {
        // A partitioned network: the connection is never answered.
        drain(client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (c2, s2) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let cut2 = cut.clone();
    std::thread::spawn(move || pump(c2, s2, cut2));
    pump(server, client, cut);
}

/// Copies `from` to `to` while traffic passes; drops what it reads while cut.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if !cut.load(Ordering::SeqCst) {
        let _ = to.shutdown(Shutdown::Write);
    }
}

/// Reads and forgets everything `stream` sends, until it closes.
fn drain(mut stream: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
}
