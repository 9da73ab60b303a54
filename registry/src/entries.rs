//! The entry types placed in the link-time slices by `#[register]`.

use mixer_core::Result;
use mixer_core::mixer::Mixer;

/// An offset pattern `f(k)` (docs/math.md §1.1): strictly increasing, `f(k) ≥ 1`; `f(0) = 1` if
/// it is to be used with the cache-efficient lattice.
#[derive(Debug)]
pub struct PatternEntry {
    /// Name used in configs (`"pattern": "pow2"`).
    pub name: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// `f(k)`; may saturate at `u64::MAX`. Every backend reads it through the offset/stride
    /// table of `mixer_core::pattern::Slots` (the CUDA kernels take that table), so a pattern
    /// needs no device code.
    pub offset: fn(usize) -> u64,
}

/// A causal level mask for the log-linear lift (docs/math.md §2.3): `ℓ(t, s)` for `s ≤ t`.
#[derive(Debug)]
pub struct MaskEntry {
    /// Name used in configs (`"mask": "fenwick"`).
    pub name: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// The level of `s` as seen from `t` (`s ≤ t`); must be `< levels(T)` for `t < T`.
    pub level: fn(usize, usize) -> usize,
    /// Number of levels needed for length `T`.
    pub levels: fn(usize) -> usize,
    /// CUDA device function `__device__ int mixers_level(long long t, long long s)`, spliced
    /// into the generic quadratic kernel.
    pub cuda: Option<&'static str>,
}

/// A λ scheme (docs/math.md §2.4): maps a raw projection and a per-(head, level) parameter
/// (learnable, initialised to 1) to a weight `λ ≥ 0`.
#[derive(Debug)]
pub struct LambdaEntry {
    /// Name used in configs (`"lambda_scheme": "softplus"`).
    pub name: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// `λ = map(raw, param)`.
    pub map: fn(f64, f64) -> f64,
    /// CUDA device function `__device__ double mixers_lambda(double raw, double param)`.
    pub cuda: Option<&'static str>,
}

/// Builds a mixer from its registered name and a JSON configuration.
pub type BuildFn = fn(&str, &serde_json::Value) -> Result<Box<dyn Mixer>>;

/// A mixer: its name, family and constructor.
#[derive(Debug)]
pub struct MixerEntry {
    /// Registered name (`"glr"`, `"mamba2"`, …).
    pub name: &'static str,
    /// Family (`"glr"`, `"attention"`, `"loglinear"`, `"toeplitz"`, or a plugin's): the key
    /// of the backends' [`FamilyEntry`]s, equal to [`Mixer::family`] of what `build` returns.
    pub family: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// Constructor from a JSON config (`{}` gives the defaults).
    pub build: BuildFn,
    /// Configurations (JSON) exercised by `mixers check` and the tour.
    pub examples: &'static [&'static str],
}

/// Availability of a backend on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Usable; the string describes the device.
    Available(String),
    /// Not usable; the string says why.
    Unavailable(String),
}

/// A compute backend (`cpu`, `cuda`, or a plugin's).
#[derive(Debug)]
pub struct BackendEntry {
    /// Name (`MIXERS_BACKEND=<name>`).
    pub name: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// Higher is preferred by `Backend::auto()` when available.
    pub priority: i32,
    /// Whether it can run here (must never panic, e.g. when a driver is missing).
    pub probe: fn() -> Availability,
    /// The timer of its device-tensor forms (device events, inputs resident on the device),
    /// for a backend with device tensors; `None` times on the host clock.
    pub timer: Option<&'static dyn crate::device::contract::DeviceTimer>,
    /// Whether independent calls may run on several host threads at once with nothing
    /// shared between them (the CPU). A packed batch's sequences then run in parallel
    /// ([`crate::packed`]); otherwise one after another.
    pub concurrent: bool,
}

pub use crate::family::FamilyEntry;

/// Where a registered entry comes from: written by `#[register]` next to every entry it
/// registers, so that duplicate names and linked plugins can be reported by crate.
#[derive(Debug)]
pub struct Origin {
    /// The registered static (compared by address).
    pub entry: &'static (dyn std::any::Any + Send + Sync),
    /// `module_path!()` where the static was registered; its first segment is the crate.
    pub module: &'static str,
}

impl Origin {
    /// The crate that registered the entry (the first segment of [`Origin::module`]).
    pub fn krate(&self) -> &'static str {
        self.module.split("::").next().unwrap_or(self.module)
    }
}

/// The partial derivatives of a registered λ scheme's map (MATH.md §2.4), needed by every
/// backward pass through a lifted mixer: `grad(raw, param) = (∂λ/∂raw, ∂λ/∂param)`. Kept
/// apart from [`LambdaEntry`] so that schemes registered without one keep compiling; a
/// scheme without it has a forward pass but no gradient.
#[derive(Debug)]
pub struct LambdaGradEntry {
    /// The λ scheme's registered name.
    pub name: &'static str,
    /// `(∂map/∂raw, ∂map/∂param)` at `(raw, param)`.
    pub grad: fn(f64, f64) -> (f64, f64),
    /// The same as a CUDA device function, `__device__ void mixers_lambda_grad(double raw,
    /// double param, double* d_raw, double* d_param)`: the CUDA backward of a lifted mixer then
    /// stays on the device (without it, it reads `lambda` back to the host, which waits for the
    /// stream and cannot be captured in a CUDA graph).
    pub cuda: Option<&'static str>,
}
