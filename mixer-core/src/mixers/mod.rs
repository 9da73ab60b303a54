//! Definitions of the builtin mixers: configuration, input spec, bounds and materialization
//! (backend-free). Backends implement their forms; `mixer-registry` registers them.

pub mod attention;
pub mod glr;
pub mod loglinear;
pub mod loglinear_state;
mod loglinear_vjp;
pub mod toeplitz;
