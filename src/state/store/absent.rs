//! A `deploy` built without the `etcd` feature: a platform naming `store "etcd"` still checks,
//! and a command that needs the store says how to get a `deploy` that has it (exit 5).

use super::{Fence, Keys, Store, StoreError, View, Write};
use crate::site::StoreSpec;
use std::time::Duration;

/// No etcd client in this build: no value of this type can exist.
pub enum Etcd {}

impl Etcd {
    pub async fn connect(_spec: &StoreSpec, platform: &str) -> Result<Etcd, StoreError> {
        Err(StoreError::NotBuilt {
            platform: platform.to_string(),
        })
    }
    pub async fn grant(&self, _ttl: Duration) -> Result<(i64, i64), StoreError> {
        match *self {}
    }
    pub async fn renew(&self, _lease: i64, _patience: Duration) -> Result<bool, StoreError> {
        match *self {}
    }
    pub async fn revoke(&self, _lease: i64) -> Result<(), StoreError> {
        match *self {}
    }
    #[allow(clippy::type_complexity)]
    pub async fn create(
        &self,
        _key: &str,
        _value: &str,
        _lease: i64,
        _patience: Duration,
    ) -> Result<Result<i64, (Vec<u8>, i64, i64)>, StoreError> {
        match *self {}
    }
    pub async fn delete_if(&self, _key: &str, _revision: i64) -> Result<bool, StoreError> {
        match *self {}
    }
    pub async fn put_unfenced(&self, _key: &str, _value: &[u8]) -> Result<(), StoreError> {
        match *self {}
    }
    pub async fn value(&self, _key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match *self {}
    }
    pub async fn range(
        &self,
        _prefix: &str,
        _keys_only: bool,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match *self {}
    }
    pub async fn value_at(&self, _key: &str) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
        match *self {}
    }
    pub async fn write_if_unchanged(
        &self,
        _key: &str,
        _revision: i64,
        _writes: &[Write],
    ) -> Result<(), StoreError> {
        match *self {}
    }
    pub async fn watch(&self, _prefix: &str) -> Result<Watching, StoreError> {
        match *self {}
    }
    pub fn endpoints(&self) -> String {
        match *self {}
    }
}

/// No mirror without etcd.
pub enum Mirror {}

impl Etcd {
    pub async fn mirror(&self, _keys: &Keys) -> Result<Mirror, StoreError> {
        match *self {}
    }
}

impl Mirror {
    pub fn view(&mut self) -> &View {
        match *self {}
    }
    pub fn value(&self, _key: &str) -> Option<&[u8]> {
        match *self {}
    }
    pub fn created_under<'a>(
        &'a self,
        _prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, i64)> + use<'a> {
        match *self {}
        #[allow(unreachable_code)]
        std::iter::empty()
    }
    pub async fn changed_under(&mut self, _etcd: &Etcd, _prefixes: &[String]) -> bool {
        match *self {}
    }
    pub async fn catch_up(&mut self) -> bool {
        match *self {}
    }
}

/// No watch without etcd.
pub enum Watching {}

impl Watching {
    pub async fn changed(&mut self) -> bool {
        match *self {}
    }
}

impl Store for Etcd {
    async fn read(&self, _keys: &Keys) -> Result<View, StoreError> {
        match *self {}
    }
    async fn write(&self, _fence: &Fence, _writes: &[Write]) -> Result<(), StoreError> {
        match *self {}
    }
}
