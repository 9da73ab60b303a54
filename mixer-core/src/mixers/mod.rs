//! Definitions of the builtin mixers: configuration, input spec, bounds and materialization
//! (backend-free). Backends implement their forms; `mixer-registry` registers them.

/// Inside an `impl Mixer for …` block, writes [`crate::Mixer::has_materialized_vjp`] (returning
/// `true`) and [`crate::Mixer::materialized_vjp`], which returns `$f(self, inputs, grad)`: the
/// mixer's map from entry gradients to input gradients. With `, with_materialization` the call
/// is `$f(self, inputs, mat, grad)`, for a map that reads the materialized entries too. The
/// `requires` argument is not passed on (every builtin map computes all its gradients).
macro_rules! materialized_vjp {
    ($f:path) => {
        materialized_vjp!(@impl |this, inputs, _mat, grad| $f(this, inputs, grad));
    };
    ($f:path, with_materialization) => {
        materialized_vjp!(@impl |this, inputs, mat, grad| $f(this, inputs, mat, grad));
    };
    (@impl |$this:ident, $inputs:ident, $mat:ident, $grad:ident| $call:expr) => {
        fn has_materialized_vjp(&self) -> bool {
            true
        }
        fn materialized_vjp(
            &self,
            $inputs: &$crate::tensor::Tensors<f64>,
            $mat: &$crate::materialize::Materialization,
            $grad: &$crate::grad::MatGrad,
            _requires: &$crate::grad::Requires,
        ) -> $crate::error::Result<$crate::tensor::Tensors<f64>> {
            let $this = self;
            $call
        }
    };
}

pub mod attention;
pub mod attention_state;
pub mod glr;
pub mod glr_state;
pub mod loglinear;
pub mod loglinear_lift_state;
pub mod loglinear_state;
mod loglinear_vjp;
pub mod toeplitz;
pub mod toeplitz_state;
