//! The library's integration tests, one binary (each test binary links the whole library, so
//! fewer binaries build faster): the registry across crates, plugins, precision modes. The
//! command line's tests are the crate `mixers-cli`'s (`cli/tests/`).

// The example plugin takes part in every registry-wide check here.
use mixers_plugin_fibonacci as _;

mod plugin;
mod precision;
mod registry;
