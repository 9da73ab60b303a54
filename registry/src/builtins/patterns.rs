//! Builtin offset patterns (docs/math.md §1.1).

use crate::entries::PatternEntry;
use crate::register;

#[register]
static POW2: PatternEntry = PatternEntry {
    name: "pow2",
    doc: "f(k) = 2^k: shortest path popcount(Δ) ≤ log₂T; lattice cache ≤ log₂T + 1",
    offset: mixer_core::pattern::pow2,
};

#[register]
static SQ1: PatternEntry = PatternEntry {
    name: "sq1",
    doc: "f(k) = k² + 1: shortest path ≤ 4 (four squares); lattice cache O(√T)",
    offset: mixer_core::pattern::sq1,
};

#[register]
static LINEAR: PatternEntry = PatternEntry {
    name: "linear",
    doc: "f(k) = k + 1: order k gives the k-th order recurrence; untruncated, the dense recurrence",
    offset: mixer_core::pattern::linear,
};
