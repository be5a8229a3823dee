//! Empty library target: this crate exists for its integration-test binary `it` (see `it/main.rs`).
