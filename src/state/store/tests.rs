//! Unit tests of the store layout and view.
