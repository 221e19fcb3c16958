//! A pull agent's writes fenced by the snapshot alone: `desired/current` read with the
//! revision it was last changed at, and writes taken only while it still is (what an agent's
//! host records, published again under the snapshot it now acts on; [`super::Fence::snapshot`]
//! fences the writes of a step, with its slot).

use super::{Etcd, StoreError, Write, MAX_OPS};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

impl Etcd {
    /// The value at `key` with the revision it was last changed at, if there is one.
    pub async fn value_at(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
        let mut r = self
            .call(|mut c| {
                let key = key.to_string();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(r.take_kvs()
            .into_iter()
            .next()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// `writes` in one transaction per [`MAX_OPS`], each taken only while `key` is still at
    /// mod revision `revision` ([`StoreError::Superseded`] once it is not: the chunks before
    /// were written). Fenced by no lock: a pull agent publishing again what its own host
    /// records, its host's only writer.
    pub async fn write_if_unchanged(
        &self,
        key: &str,
        revision: i64,
        writes: &[Write],
    ) -> Result<(), StoreError> {
        let writes = super::last_per_key(writes);
        for chunk in writes.chunks(MAX_OPS) {
            let r = self.txn(if_unchanged_txn(key, revision, chunk)).await?;
            if !r.succeeded() {
                let now = r
                    .op_responses()
                    .into_iter()
                    .find_map(|op| match op {
                        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.mod_revision()),
                        _ => None,
                    })
                    .unwrap_or(0);
                return Err(StoreError::Superseded {
                    key: key.to_string(),
                    revision,
                    now,
                });
            }
        }
        Ok(())
    }
}

/// The transaction that puts `writes` only while `key` is still at mod revision `revision`
/// (a pull agent's records published again under the snapshot it now acts on); when not taken,
/// it reads `key`.
fn if_unchanged_txn(key: &str, revision: i64, writes: &[&Write]) -> Txn {
    let ops: Vec<TxnOp> = writes
        .iter()
        .map(|w| match *w {
            Write::Put { key, value } => TxnOp::put(key.as_str(), value.as_str(), None),
            Write::Delete { key } => TxnOp::delete(key.as_str(), None),
        })
        .collect();
    Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
        .and_then(ops)
        .or_else([TxnOp::get(key, None)])
}
