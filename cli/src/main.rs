//! The `mixers` command line (see `mixers --help`).

// Link the example plugin so its pattern, mask, λ scheme and mixers appear in the CLI; a
// crate nothing references is dropped by the linker together with its registrations.
#[cfg(feature = "example-plugin")]
use mixers_plugin_fibonacci as _;

// Counts heap bytes so that `mixers bench` can report peak working memory.
#[global_allocator]
static ALLOC: mixers::alloc::CountingAlloc = mixers::alloc::CountingAlloc;

fn main() {
    std::process::exit(mixers_cli::main());
}
