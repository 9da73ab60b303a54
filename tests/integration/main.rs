//! The facade's integration tests, one binary (each test binary links the whole library, so
//! fewer binaries build faster): the command line, the registry across crates, plugins.
//! `tests/bench.rs` stays a binary of its own: it installs a counting global allocator whose
//! process-wide counters other tests running in parallel would disturb.

// The example plugin takes part in every registry-wide check here.
use mixers_plugin_fibonacci as _;

mod cli;
mod plugin;
mod precision;
mod registry;
mod train;
