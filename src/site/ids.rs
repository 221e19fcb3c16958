//! Typed indices: a service, a class or a host is named across stages by its own index type,
//! never a bare `usize`, and the lists they index ([`IdVec`]) take only their own.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// An index type: a newtype over a list position.
pub trait Id: Copy {
    fn new(index: usize) -> Self;
    fn index(self) -> usize;
}

/// Declares an index newtype: serialized as the bare number (`serde(transparent)`), so saved
/// plans, journals and store keys read as before.
macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            Debug,
            serde::Serialize,
            serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(usize);

        impl $name {
            /// The index at this position.
            pub const fn new(index: usize) -> Self {
                Self(index)
            }

            /// Its position in the list it indexes.
            pub const fn index(self) -> usize {
                self.0
            }
        }

        impl $crate::site::Id for $name {
            fn new(index: usize) -> Self {
                Self(index)
            }
            fn index(self) -> usize {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}
pub(crate) use id_type;

id_type!(
    /// Index of a class in [`super::Site::classes`].
    ClassId
);
id_type!(
    /// Index of a service in [`super::Site::services`].
    ServiceId
);

/// A list indexed by its own index type `I` only.
pub struct IdVec<I, T> {
    items: Vec<T>,
    id: PhantomData<fn(I) -> I>,
}

impl<I: Id, T> IdVec<I, T> {
    pub const fn new() -> Self {
        Self {
            items: Vec::new(),
            id: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn get(&self, id: I) -> Option<&T> {
        self.items.get(id.index())
    }

    pub fn get_mut(&mut self, id: I) -> Option<&mut T> {
        self.items.get_mut(id.index())
    }

    /// Adds `item` at the end: its index.
    pub fn push(&mut self, item: T) -> I {
        self.items.push(item);
        I::new(self.items.len() - 1)
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, T> {
        self.items.iter_mut()
    }

    /// Every index, in order.
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = I> + ExactSizeIterator + use<I, T> {
        (0..self.items.len()).map(I::new)
    }

    /// Every item with its index, in order.
    pub fn enumerate(&self) -> impl DoubleEndedIterator<Item = (I, &T)> + ExactSizeIterator {
        self.items.iter().enumerate().map(|(i, t)| (I::new(i), t))
    }

    /// The index of the first item `pick` takes.
    pub fn position(&self, pick: impl FnMut(&T) -> bool) -> Option<I> {
        self.items.iter().position(pick).map(I::new)
    }

    pub fn extend(&mut self, items: impl IntoIterator<Item = T>) {
        self.items.extend(items);
    }

    pub fn as_slice(&self) -> &[T] {
        &self.items
    }

    pub fn into_vec(self) -> Vec<T> {
        self.items
    }
}

impl<I: Id, T> Index<I> for IdVec<I, T> {
    type Output = T;
    fn index(&self, id: I) -> &T {
        &self.items[id.index()]
    }
}

impl<I: Id, T> IndexMut<I> for IdVec<I, T> {
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.index()]
    }
}

impl<I, T> From<Vec<T>> for IdVec<I, T> {
    fn from(items: Vec<T>) -> Self {
        Self {
            items,
            id: PhantomData,
        }
    }
}

impl<I, T> FromIterator<T> for IdVec<I, T> {
    fn from_iter<It: IntoIterator<Item = T>>(iter: It) -> Self {
        Vec::from_iter(iter).into()
    }
}

impl<'a, I, T> IntoIterator for &'a IdVec<I, T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<'a, I, T> IntoIterator for &'a mut IdVec<I, T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter_mut()
    }
}

impl<I, T> IntoIterator for IdVec<I, T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<I, T: Clone> Clone for IdVec<I, T> {
    fn clone(&self) -> Self {
        self.items.clone().into()
    }
}

impl<I, T> Default for IdVec<I, T> {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl<I, T: PartialEq> PartialEq for IdVec<I, T> {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

impl<I, T: Eq> Eq for IdVec<I, T> {}

impl<I, T: fmt::Debug> fmt::Debug for IdVec<I, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.items.fmt(f)
    }
}

/// For tests: these positions as ids.
#[cfg(test)]
pub fn ids_of<I: Id>(positions: &[usize]) -> Vec<I> {
    positions.iter().copied().map(I::new).collect()
}
