//! Builtin level masks (docs/math.md §2.2).

use crate::entries::MaskEntry;
use crate::register;

#[register]
static FENWICK: MaskEntry = MaskEntry {
    name: "fenwick",
    doc: "Fenwick-tree levels ℓ(t,s) = bitlen(t XOR s); O(log T) buckets per token",
    level: mixer_core::fenwick::level,
    levels: mixer_core::fenwick::num_levels,
    cuda: Some(
        "__device__ int mixers_level(long long t, long long s) { return t == s ? 0 : 64 - __clzll(t ^ s); }",
    ),
};
