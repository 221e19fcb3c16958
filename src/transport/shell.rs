//! One shell kept open on a host for a link's later commands: each command is a block sent on
//! the shell's standard input and run there as `setsid /bin/sh -c <block>`, its output read
//! back up to a marker, so that a command costs no new SSH session.
//!
//! The shell ([`loop_script`]) reads a header line (`<n>`, then ` input` and ` after` as they
//! apply), then the block's lines up to a line holding only its token, then (with `input`) the
//! standard input the same way. A block marked `after` runs only if the command before it
//! exited 0; otherwise it is skipped, and its marker carries `-` for an exit code (and so do
//! those of the `after` blocks that follow it). That is how a [chain](Shell::submit) of
//! commands goes to the host at once: one round trip for all of them, each still reported
//! as it ends. `setsid` gives the block a process group of its own whose id is its `$$`, as
//! sshd gives every session (the contract of [`super::Link::run`]). When the block ends the
//! shell prints `\n<token> <n> <exit code>\n` on standard output and `\n<token> <n>\n` on
//! standard error; the output before each marker is the command's. The token is random, so
//! no command prints it by chance.
//!
//! As with a session per command, a command ends once the processes it leaves in its group
//! no longer hold its output ([`LOOP`]). What differs: a process that left the command's
//! group (a daemon that calls `setsid` itself) and still holds the output is not waited for
//! (its later output is read as the next command's), an exit by signal reads as
//! `128 + signal`, and the input must be text (it is read line by line). Hosts without
//! `setsid` say so at once and the link goes on with a session per command.

use super::Output;
use std::hash::{BuildHasher, Hasher};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// An open shell on a host.
pub struct Shell {
    stdin: Writer,
    stdout: Stream,
    stderr: Stream,
    token: String,
    /// The number of the last command sent.
    sent: u64,
    /// Commands were sent and their output not all read: a chain still being collected, or a
    /// command whose future was dropped (a timeout), so the shell may still be running it and
    /// is out of step.
    busy: bool,
    /// The shell's first line was read.
    ready: bool,
    /// Whatever keeps the shell alive (its process or remote child); dropped with it.
    _keep: Box<dyn Send>,
}

/// Why a command did not run in the shell.
#[derive(Debug)]
pub enum ShellError {
    /// The shell cannot run commands here (it said so or ended before its first line); the
    /// command did not run and may be sent another way.
    Unavailable(String),
    /// This command cannot go through the shell (input that is not text, a NUL byte); it did
    /// not run and may be sent another way; the shell stays in step for the next one.
    Unsuitable(String),
    /// The shell was lost while it ran the command.
    Lost(String),
}

impl std::fmt::Display for ShellError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShellError::Unavailable(why) => write!(f, "no shell kept on the host: {why}"),
            ShellError::Unsuitable(why) => write!(f, "not for the kept shell: {why}"),
            ShellError::Lost(why) => write!(f, "the host's shell was lost: {why}"),
        }
    }
}

/// The text the shell runs, given its token: a `/bin/sh` loop (see the module's documentation).
pub fn loop_script(token: &str) -> String {
    LOOP.replace("TOKEN", token)
}

/// The loop. After a command ends, it waits while a process of the command's group still
/// holds the shell's output (found under `/proc`), as a session per command waits for its
/// output to close: a hook that leaves a process writing there is timed out as it would be
/// without the shell, not cut off from its output once the run ends. `held` looks at each
/// process's output first (two `stat`s) and reads its `stat` file (byte by byte, as the
/// shell's `read` does) only for the few that hold the shell's: on a busy host that is ten
/// times cheaper than reading every process's group first.
const LOOP: &str = r#"T=TOKEN; N='
'
command -v setsid >/dev/null 2>&1 || { echo "$T no-setsid"; exit 0; }
held() {
  g=$1
  for d in /proc/[0-9]*; do
    [ "$d/fd/1" -ef "/proc/$$/fd/1" ] || [ "$d/fd/2" -ef "/proc/$$/fd/2" ] || continue
    { read -r l <"$d/stat"; } 2>/dev/null || continue
    l=${l##*) }; set -- $l
    [ "$3" = "$g" ] && return 0
  done
  return 1
}
echo "$T ready"
r=0
while IFS= read -r h; do
  b=; while IFS= read -r l && [ "$l" != "$T" ]; do b="$b$l$N"; done
  i=; case $h in *' input'*) while IFS= read -r l && [ "$l" != "$T" ]; do i="$i$l$N"; done;; esac
  case $h in *' after') [ "$r" = 0 ] || {
    printf '\n%s %s -\n' "$T" "${h%% *}"; printf '\n%s %s\n' "$T" "${h%% *}" >&2; continue; };;
  esac
  case $h in
  *' input'*) printf %s "$i" | setsid /bin/sh -c "$b" & ;;
  *) setsid /bin/sh -c "$b" </dev/null & ;;
  esac
  p=$!; wait $p; r=$?
  while kill -0 -$p 2>/dev/null && held $p; do sleep 0.05 2>/dev/null || sleep 1; done
  printf '\n%s %s %s\n' "$T" "${h%% *}" "$r"; printf '\n%s %s\n' "$T" "${h%% *}" >&2
done"#;

/// A fresh random token (letters and digits).
pub fn token() -> String {
    let state = std::collections::hash_map::RandomState::new();
    let mut a = state.build_hasher();
    a.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut b = state.build_hasher();
    b.write_u64(a.finish() ^ u64::from(std::process::id()));
    format!("drover{:016x}{:016x}", a.finish(), b.finish())
}

impl Shell {
    /// A shell already started with [`loop_script`]`(token)` and these pipes.
    pub fn new(
        token: String,
        stdin: Writer,
        stdout: Reader,
        stderr: Reader,
        keep: Box<dyn Send>,
    ) -> Shell {
        Shell {
            stdin,
            stdout: Stream::new(stdout),
            stderr: Stream::new(stderr),
            token,
            sent: 0,
            busy: false,
            ready: false,
            _keep: keep,
        }
    }

    /// Whether a command was left half read (see [`Shell::busy`]); such a shell is dropped.
    pub fn out_of_step(&self) -> bool {
        self.busy
    }

    /// Runs `script` (with `input` on its standard input) and returns its output.
    pub async fn run(&mut self, script: &str, input: Option<&[u8]>) -> Result<Output, ShellError> {
        let sent = self.submit(&[(script, input)]).await?;
        match self.collect(sent[0]).await? {
            Some(out) => Ok(out),
            None => Err(ShellError::Lost("the shell skipped a command".into())),
        }
    }

    /// Sends `commands` at once, each after the first marked to run only if the one before it
    /// exited 0, and returns their numbers for [`Shell::collect`]. Nothing is sent if one of
    /// them cannot go through the shell ([`ShellError::Unsuitable`]).
    pub async fn submit(
        &mut self,
        commands: &[(&str, Option<&[u8]>)],
    ) -> Result<Vec<u64>, ShellError> {
        let mut text = String::new();
        let mut numbers = Vec::with_capacity(commands.len());
        let first = self.sent;
        for (i, (script, input)) in commands.iter().enumerate() {
            match self.frame(script, *input, i > 0) {
                Ok(frame) => text.push_str(&frame),
                Err(e) => {
                    self.sent = first;
                    return Err(e);
                }
            }
            numbers.push(self.sent);
        }
        // Nothing is sent before the shell said it is ready: a shell that cannot run commands
        // (no `setsid`, or a login shell printing something of its own first) is given up for
        // sessions of their own, and what was sent to it must not run there as well.
        if let Err(e) = self.wait_ready().await {
            self.sent = first;
            return Err(e);
        }
        self.busy = true;
        let lost = |e: std::io::Error| ShellError::Lost(e.to_string());
        self.send(&text).await.map_err(lost)?;
        Ok(numbers)
    }

    /// Reads the shell's first line, once: ready, or why it cannot run commands
    /// ([`ShellError::Unavailable`]).
    pub async fn wait_ready(&mut self) -> Result<(), ShellError> {
        if self.ready {
            return Ok(());
        }
        self.first_line().await
    }

    /// The output of command `n`, sent by [`Shell::submit`], once it ends; `None` if it was
    /// skipped (the command before it did not exit 0). Commands are collected in order.
    pub async fn collect(&mut self, n: u64) -> Result<Option<Output>, ShellError> {
        let lost = |e: std::io::Error| ShellError::Lost(e.to_string());
        let out_mark = format!("\n{} {n} ", self.token);
        let err_mark = format!("\n{} {n}\n", self.token);
        let (out, err) = tokio::join!(
            self.stdout.until(out_mark.as_bytes(), true),
            self.stderr.until(err_mark.as_bytes(), false)
        );
        let (stdout, code) = out.map_err(lost)?;
        let (stderr, _) = err.map_err(lost)?;
        self.busy = n != self.sent;
        if code.as_deref() == Some("-") {
            return Ok(None);
        }
        let code = code
            .and_then(|c| c.parse::<i32>().ok())
            .ok_or_else(|| ShellError::Lost("the shell's marker had no exit code".into()))?;
        Ok(Some(Output {
            code: Some(code),
            stdout,
            stderr,
        }))
    }

    /// The bytes to send for one command; refuses text the shell would not read back whole.
    fn frame(
        &mut self,
        script: &str,
        input: Option<&[u8]>,
        after: bool,
    ) -> Result<String, ShellError> {
        let input = match input {
            Some(bytes) => Some(
                std::str::from_utf8(bytes)
                    .ok()
                    .filter(|t| !t.contains('\0'))
                    .ok_or_else(|| ShellError::Unsuitable("input is not text".into()))?,
            ),
            None => None,
        };
        if script.contains('\0') {
            return Err(ShellError::Unsuitable("command holds a NUL byte".into()));
        }
        self.sent += 1;
        let mut text = self.sent.to_string();
        if input.is_some() {
            text.push_str(" input");
        }
        if after {
            text.push_str(" after");
        }
        text.push('\n');
        for part in std::iter::once(script).chain(input) {
            text.push_str(part);
            if !part.is_empty() && !part.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&self.token);
            text.push('\n');
        }
        Ok(text)
    }

    async fn send(&mut self, text: &str) -> std::io::Result<()> {
        self.stdin.write_all(text.as_bytes()).await?;
        self.stdin.flush().await
    }

    /// Reads the shell's first line: ready, or why it cannot run commands.
    async fn first_line(&mut self) -> Result<(), ShellError> {
        let mark = format!("{} ", self.token);
        let line = self.stdout.line().await.map_err(|e| {
            ShellError::Unavailable(format!("the shell ended before it started: {e}"))
        })?;
        match line.strip_prefix(mark.as_str()) {
            Some("ready") => {
                self.ready = true;
                Ok(())
            }
            Some(why) => Err(ShellError::Unavailable(why.to_string())),
            None => Err(ShellError::Unavailable(format!(
                "the shell began with {:?}",
                line.chars().take(80).collect::<String>()
            ))),
        }
    }
}

/// One of the shell's output streams, with what was read past the last marker.
struct Stream {
    reader: Reader,
    buf: Vec<u8>,
}

impl Stream {
    fn new(reader: Reader) -> Stream {
        Stream {
            reader,
            buf: Vec::new(),
        }
    }

    /// Reads up to `mark` and the end of its line; returns what came before the mark and,
    /// with `word`, the rest of the marker's line (the exit code).
    async fn until(
        &mut self,
        mark: &[u8],
        word: bool,
    ) -> std::io::Result<(Vec<u8>, Option<String>)> {
        let mut from = 0;
        loop {
            if let Some(at) = find(&self.buf[from..], mark).map(|i| i + from) {
                let rest = at + mark.len();
                let end = if word {
                    match self.buf[rest..].iter().position(|&c| c == b'\n') {
                        Some(i) => rest + i + 1,
                        None => {
                            self.fill().await?;
                            continue;
                        }
                    }
                } else {
                    rest
                };
                let tail = String::from_utf8_lossy(&self.buf[rest..end])
                    .trim()
                    .to_string();
                let before = self.buf[..at].to_vec();
                self.buf.drain(..end);
                return Ok((before, word.then_some(tail)));
            }
            from = self.buf.len().saturating_sub(mark.len());
            self.fill().await?;
        }
    }

    /// Reads one line (without its newline).
    async fn line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(i) = self.buf.iter().position(|&c| c == b'\n') {
                let line = String::from_utf8_lossy(&self.buf[..i]).to_string();
                self.buf.drain(..=i);
                return Ok(line);
            }
            self.fill().await?;
        }
    }

    /// Reads what is there into `buf` (not through a buffer on the stack: this future is part
    /// of every command's, and a step nests several).
    async fn fill(&mut self) -> std::io::Result<()> {
        self.buf.reserve(16 * 1024);
        let n = self.reader.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the shell's output ended",
            ));
        }
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod cost;
#[cfg(test)]
mod tests;
