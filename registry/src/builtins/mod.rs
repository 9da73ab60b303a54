//! The builtin patterns, masks and λ schemes, registered through the same `#[register]`
//! attribute a plugin uses, and the builtin mixers' constructors.

mod attention;
mod glr;
mod lambdas;
mod loglinear;
mod masks;
mod patterns;
mod toeplitz;
