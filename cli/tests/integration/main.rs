//! The command line's integration tests, one binary (each test binary links the whole
//! library, so fewer binaries build faster): the `mixers` binary as a user meets it, and
//! `mixers train`. `tests/bench.rs` stays a binary of its own: it installs a counting global
//! allocator whose process-wide counters other tests running in parallel would disturb.

mod cli;
mod train;
