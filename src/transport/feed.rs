//! Feeding a child's standard input from a reader while collecting its output: one helper for
//! every link kind, so that a payload of any size streams through a bounded buffer.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Copies `input` (a payload opened before the command started, so that one that cannot be
/// read never reaches it as an empty input) into `stdin` and closes it, concurrently with
/// reading `stdout` and `stderr` to their ends. A command that exits without reading all its
/// input is not an error here; a payload that fails mid-way is.
pub async fn feed<W, O, E>(
    stdin: Option<W>,
    stdout: Option<O>,
    stderr: Option<E>,
    mut input: Box<dyn AsyncRead + Send + Unpin + '_>,
) -> std::io::Result<(Vec<u8>, Vec<u8>)>
where
    W: AsyncWrite + Unpin,
    O: AsyncRead + Unpin,
    E: AsyncRead + Unpin,
{
    let write = async move {
        let Some(mut stdin) = stdin else {
            return Ok(());
        };
        // Read errors end the copy with an error; write errors (the command stopped reading)
        // do not.
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = input.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if stdin.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = stdin.shutdown().await;
        Ok::<(), std::io::Error>(())
    };
    let read = |r: Option<O>| async move {
        let mut out = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut out).await;
        }
        out
    };
    let read_err = |r: Option<E>| async move {
        let mut out = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut out).await;
        }
        out
    };
    let (written, out, err) = tokio::join!(write, read(stdout), read_err(stderr));
    written?;
    Ok((out, err))
}
