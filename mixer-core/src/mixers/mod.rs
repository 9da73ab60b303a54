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

/// Inside an `impl Mixer for …` block, writes [`crate::Mixer::state_oracle`] and
/// [`crate::Mixer::state_oracle_vjp`], the `f64` references of runs from a state:
/// - `state_oracle!(extension $module)`: the module's `run` and `vjp` (a form on the extension
///   by the cached prefix) with the dense oracle as the form ([`crate::oracle::dense`]) and
///   the materialized backward ([`crate::grad::materialized_backward`]) as its backward;
/// - `state_oracle!($module)`: the module's own `oracle` and `oracle_vjp`;
/// - `state_oracle!(|m, x, s| run, |m, x, s, dy, df, req| vjp)`: the two expressions, with `m`
///   the mixer and the other names the methods' arguments.
macro_rules! state_oracle {
    (extension $module:ident) => {
        state_oracle!(
            |m, x, s| $module::run(m, x, s, |e| $crate::oracle::dense(m, e)),
            |m, x, s, dy, df, req| $module::vjp(
                m,
                $crate::state::StateVjp { x, initial: s, dy, d_final: df, requires: req },
                |e, d| { $crate::grad::materialized_backward(m, e, d, &$crate::grad::Requires::All) }
            )
        );
    };
    ($module:ident) => {
        state_oracle!(|m, x, s| $module::oracle(m, x, s), |m, x, s, dy, df, req| {
            $module::oracle_vjp(m, x, s, dy, df, req)
        });
    };
    (|$m:ident, $x:ident, $s:ident| $run:expr,
        |$m2:ident, $x2:ident, $s2:ident, $dy:ident, $df:ident, $req:ident| $vjp:expr) => {
        fn state_oracle(
            &self,
            $x: &$crate::tensor::Tensors<f64>,
            $s: Option<&$crate::tensor::Tensors<f64>>,
        ) -> $crate::error::Result<(::ndarray::ArrayD<f64>, $crate::tensor::Tensors<f64>)> {
            let $m = self;
            $run
        }
        fn state_oracle_vjp(
            &self,
            $x2: &$crate::tensor::Tensors<f64>,
            $s2: Option<&$crate::tensor::Tensors<f64>>,
            $dy: &::ndarray::ArrayD<f64>,
            $df: Option<&$crate::tensor::Tensors<f64>>,
            $req: &$crate::grad::Requires,
        ) -> $crate::error::Result<($crate::tensor::Tensors<f64>, $crate::tensor::Tensors<f64>)> {
            let $m2 = self;
            $vjp
        }
    };
}

pub mod attention;
pub mod cache;
pub mod glr;
pub mod loglinear;
#[cfg(test)]
mod state_check;
pub mod toeplitz;
