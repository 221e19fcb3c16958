//! The history in the platform's store (etcd), so that a controller with a fresh checkout sees
//! the runs another one made: `<prefix>/<site>/history/runs/<run>` (the [`Entry`]) and
//! `<prefix>/<site>/history/blobs/<sha256>/<n>` (each content in chunks of at most [`CHUNK`]
//! bytes, below etcd's default request limit of 1.5 MiB). Contents go first, the entry last: an
//! entry in the store names only contents that are there.

use super::{parse_entry, Blobs, Digest, Entry, HistoryError};
use crate::site::Site;
use crate::state::store::{Etcd, Keys};
use std::collections::BTreeSet;

/// The largest chunk of a content, in bytes: with its key and the request's framing, well
/// below etcd's `--max-request-bytes` default (1.5 MiB).
pub const CHUNK: usize = 1024 * 1024;

/// `bytes` as the chunks they are kept in: at least one (an empty content is one empty chunk).
pub fn chunks(bytes: &[u8]) -> Vec<&[u8]> {
    if bytes.is_empty() {
        return vec![bytes];
    }
    bytes.chunks(CHUNK).collect()
}

/// The chunks' numbers from their keys under `prefix` (as a keys-only range read gives them),
/// checked to be `0..n` with none missing; `n`.
pub fn chunk_count(prefix: &str, keys: &[String]) -> Result<usize, String> {
    let mut numbers = Vec::with_capacity(keys.len());
    for key in keys {
        let n: usize = key
            .strip_prefix(prefix)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("{key}: not a chunk"))?;
        numbers.push(n);
    }
    numbers.sort_unstable();
    if numbers.iter().enumerate().any(|(i, n)| i != *n) {
        return Err(format!("{prefix}: chunks are missing"));
    }
    Ok(numbers.len())
}

/// The store's keys of `site`, if its platform names a store.
fn keys(site: &Site) -> Option<Keys> {
    let spec = site.platform.store.as_ref()?;
    Some(Keys::new(&spec.prefix, &site.name))
}

/// Runs `work` against the site's store, if it has one.
fn with_store<T: Default>(
    site: &Site,
    work: impl AsyncFnOnce(&Etcd, &Keys) -> Result<T, HistoryError>,
) -> Result<T, HistoryError> {
    let (Some(spec), Some(keys)) = (&site.platform.store, keys(site)) else {
        return Ok(T::default());
    };
    let runtime = crate::session::runtime().map_err(|source| HistoryError::Write {
        path: "the async runtime".into(),
        source,
    })?;
    runtime.block_on(async {
        let etcd = Etcd::connect(spec, &site.platform.name).await?;
        work(&etcd, &keys).await
    })
}

/// Writes each of `entries` the store does not have yet (a run whose entry could not reach it
/// is written by the next run that does): its contents (those not there yet), then the entry.
pub fn publish(site: &Site, blobs: &Blobs, entries: &[Entry]) -> Result<(), HistoryError> {
    with_store(site, async |etcd: &Etcd, keys: &Keys| {
        let there: BTreeSet<String> = etcd
            .range(&keys.history_runs(), true)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for entry in entries {
            let key = format!("{}{}", keys.history_runs(), entry.run);
            if !there.contains(&key) {
                publish_one(etcd, keys, blobs, entry, &key).await?;
            }
        }
        Ok(())
    })
}

/// `entry`'s contents the store lacks, then `entry` at `key`.
async fn publish_one(
    etcd: &Etcd,
    keys: &Keys,
    blobs: &Blobs,
    entry: &Entry,
    key: &str,
) -> Result<(), HistoryError> {
    put_contents(etcd, keys, blobs, entry.snapshot.digests()).await?;
    let value = serde_json::to_vec(entry).map_err(|e| HistoryError::Entry {
        path: entry.run.to_string(),
        reason: e.to_string(),
    })?;
    etcd.put_unfenced(key, &value).await?;
    Ok(())
}

/// Writes each of `digests` the store lacks from `blobs` to `history/blobs/<sha256>/<n>`, in
/// chunks of at most [`CHUNK`] bytes (a content already there is left as it is: the same
/// bytes whoever wrote it); how many it wrote. Also what `deploy publish` keeps a snapshot's
/// contents with (`crate::publish`).
pub async fn put_contents<'d>(
    etcd: &Etcd,
    keys: &Keys,
    blobs: &Blobs,
    digests: impl IntoIterator<Item = &'d Digest>,
) -> Result<usize, HistoryError> {
    let digests: BTreeSet<&Digest> = digests.into_iter().collect();
    let mut written = 0;
    for digest in digests {
        let prefix = keys.history_blob(digest.as_str());
        if !etcd.range(&prefix, true).await?.is_empty() {
            continue;
        }
        let path = blobs.path(digest);
        let mut file = std::fs::File::open(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => HistoryError::Missing {
                path: path.display().to_string(),
                digest: digest.clone(),
            },
            _ => HistoryError::Read {
                path: path.clone(),
                source,
            },
        })?;
        // One chunk in memory at a time; an empty content is one empty chunk.
        let mut chunk = vec![0u8; CHUNK];
        for i in 0.. {
            let n = fill(&mut file, &mut chunk).map_err(|source| HistoryError::Read {
                path: path.clone(),
                source,
            })?;
            if n == 0 && i > 0 {
                break;
            }
            etcd.put_unfenced(&format!("{prefix}{i}"), &chunk[..n])
                .await?;
            if n < CHUNK {
                break;
            }
        }
        written += 1;
    }
    Ok(written)
}

/// Every entry of the site in the store (none without one).
pub fn entries(site: &Site) -> Result<Vec<Entry>, HistoryError> {
    with_store(site, async |etcd: &Etcd, keys: &Keys| {
        let mut out = Vec::new();
        for (key, value) in etcd.range(&keys.history_runs(), false).await? {
            out.push(parse_entry(&key, &value)?);
        }
        Ok(out)
    })
}

/// Brings each of `digests` that `blobs` lacks from the store into `blobs`; one the store
/// lacks too is left out (putting the snapshot back names it).
pub fn fetch(site: &Site, blobs: &Blobs, digests: &[&Digest]) -> Result<(), HistoryError> {
    if digests.iter().all(|d| blobs.has(d)) {
        return Ok(());
    }
    with_store(site, async |etcd: &Etcd, keys: &Keys| {
        get_contents(etcd, keys, blobs, digests.iter().copied()).await
    })
}

/// Brings each of `digests` that `blobs` lacks from `history/blobs/` into `blobs`, each
/// checked against its digest; one the store lacks too is left out.
pub async fn get_contents<'d>(
    etcd: &Etcd,
    keys: &Keys,
    blobs: &Blobs,
    digests: impl IntoIterator<Item = &'d Digest>,
) -> Result<(), HistoryError> {
    let wanted: BTreeSet<&Digest> = digests.into_iter().filter(|d| !blobs.has(d)).collect();
    for digest in wanted {
        let prefix = keys.history_blob(digest.as_str());
        let chunks: Vec<String> = etcd
            .range(&prefix, true)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if chunks.is_empty() {
            continue;
        }
        let damaged = |reason: String| HistoryError::Entry {
            path: prefix.clone(),
            reason,
        };
        let n = chunk_count(&prefix, &chunks).map_err(damaged)?;
        let mut w = blobs.writer().map_err(HistoryError::Blob)?;
        for i in 0..n {
            let key = format!("{prefix}{i}");
            let bytes = etcd
                .value(&key)
                .await?
                .ok_or_else(|| damaged(format!("{key} went while it was read")))?;
            w.write(&bytes).map_err(HistoryError::Blob)?;
        }
        w.finish(Some(digest)).map_err(HistoryError::Blob)?;
    }
    Ok(())
}

/// Reads into `buf` until it is full or the file ends; how much it read.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read as _;
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Any content cut into chunks as `publish` cuts it (at most CHUNK bytes each, at least
        /// one) and written back in chunk order through a blob writer is the same content; a
        /// missing chunk is found from the keys, a changed one by the digest.
        #[test]
        fn chunks_make_the_content_again(
            len in prop_oneof![0usize..10, (CHUNK - 2)..(CHUNK + 2), (2 * CHUNK)..(2 * CHUNK + 3)],
            seed in any::<u8>(),
            drop in any::<prop::sample::Index>(),
        ) {
            let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            let digest = Digest::of(&bytes);
            let dir = tempfile::tempdir().unwrap();
            let source = dir.path().join("source");
            std::fs::write(&source, &bytes).unwrap();
            let mut file = std::fs::File::open(&source).unwrap();
            let mut parts: Vec<Vec<u8>> = Vec::new();
            let mut chunk = vec![0u8; CHUNK];
            for i in 0.. {
                let n = fill(&mut file, &mut chunk).unwrap();
                if n == 0 && i > 0 {
                    break;
                }
                parts.push(chunk[..n].to_vec());
                if n < CHUNK {
                    break;
                }
            }
            prop_assert!(parts.iter().all(|c| c.len() <= CHUNK));
            prop_assert_eq!(parts.len(), len.div_ceil(CHUNK).max(1));
            let prefix = "/d/s/history/blobs/x/";
            let keys: Vec<String> = (0..parts.len()).rev().map(|i| format!("{prefix}{i}")).collect();
            prop_assert_eq!(chunk_count(prefix, &keys), Ok(parts.len()));
            let blobs = Blobs::new(dir.path().join("blobs"));
            let mut w = blobs.writer().unwrap();
            for p in &parts {
                w.write(p).unwrap();
            }
            prop_assert_eq!(w.finish(Some(&digest)).unwrap(), digest.clone());
            prop_assert_eq!(blobs.get(&digest).unwrap(), Some(bytes.clone()));
            if parts.len() > 1 {
                // Any chunk but the last (keys[0]: the last one missing is found by the
                // digest).
                let mut short = keys.clone();
                short.remove(1 + drop.index(short.len() - 1));
                prop_assert!(chunk_count(prefix, &short).is_err());
            }
            if len > 0 {
                let mut w = blobs.writer().unwrap();
                w.write(&parts[0][1..]).unwrap();
                prop_assert!(w.finish(Some(&digest)).is_err());
            }
        }
    }
}
