//! The journal's one writer: a thread of its own, fed through a channel, that appends the
//! lines it is sent in the order they were sent and syncs them (`fsync`), answering each line
//! that waits for the disk once it is there. Lines sent while it syncs are written together
//! and synced once (group commit): many steps ending at once cost one sync, not one each. No
//! thread of the async runtime ever syncs the journal.

use std::io::Write;
use std::sync::mpsc::{Receiver, Sender};

/// The answer to a line that waits for the disk: `Err` with why when it is not there.
pub(super) type Ack = Sender<Result<(), String>>;

/// What the writer is sent.
pub(super) enum Order {
    /// A line that only informs: written with the next line that is synced.
    Note(Vec<u8>),
    /// A line to sync, and where to say once it is on disk (or cannot be).
    Append(Vec<u8>, Ack),
    /// For tests: write to this file from now on.
    #[cfg(test)]
    Swap(std::fs::File),
}

/// The writer's own: the file, and what it was sent but has not written.
pub(super) struct Writer {
    file: std::fs::File,
    /// Lines not yet written, noted ones among them.
    pending: Vec<u8>,
    /// Who waits for the lines in `pending` to be synced.
    waiting: Vec<Ack>,
    /// A write failed: the file may end in part of a line, so the next write starts on a line
    /// of its own (an empty line is nothing to a reader; two entries glued into one would be
    /// a damaged line).
    torn: bool,
}

impl Writer {
    pub(super) fn new(file: std::fs::File) -> Writer {
        Writer {
            file,
            pending: Vec::new(),
            waiting: Vec::new(),
            torn: false,
        }
    }

    /// Runs until every sender is gone: takes one order (waiting for it), then every order
    /// already sent, writes them all and syncs once if any line waits for the disk. Noted
    /// lines left when the senders go are not written: nothing waited for them.
    pub(super) fn run(mut self, orders: Receiver<Order>) {
        while let Ok(first) = orders.recv() {
            self.take(first);
            while let Ok(order) = orders.try_recv() {
                self.take(order);
            }
            self.sync();
        }
    }

    fn take(&mut self, order: Order) {
        match order {
            Order::Note(line) => self.pending.extend_from_slice(&line),
            Order::Append(line, ack) => {
                self.pending.extend_from_slice(&line);
                self.waiting.push(ack);
            }
            #[cfg(test)]
            Order::Swap(file) => {
                // What was sent before goes to the file it was sent for.
                self.sync();
                self.file = file;
            }
        }
    }

    /// Writes what is pending and syncs it, then answers whoever waits for it; nothing when
    /// no line waits (noted lines wait for the next synced one).
    fn sync(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.pending);
        if self.torn {
            batch.insert(0, b'\n');
        }
        let result = self
            .file
            .write_all(&batch)
            .and_then(|_| self.file.sync_data())
            .map_err(|e| e.to_string());
        self.torn = result.is_err();
        for ack in self.waiting.drain(..) {
            // One that stopped waiting needs no answer.
            let _ = ack.send(result.clone());
        }
    }
}
