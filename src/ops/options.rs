//! The options every typed operation takes: form, backend, precision, and the per-family
//! settings (chunk, scale, window, level mask, λ scheme), with registry entries taken by name
//! or by value.

use mixer_core::{Error, Form, Result};
use mixer_registry::{Backend, LambdaEntry, MaskEntry, PatternEntry};

/// How the arithmetic is done: `exact` (default), `tf32` or `bf16` (see
/// [`mixer_core::precision`]).
pub use mixer_core::Precision;

/// A registry entry (offset pattern, level mask or λ scheme) named by its registered name or
/// given by value (a reference to its registered `static`).
///
/// Giving an entry by value avoids a misspelt name, and naming a plugin's `static` also keeps
/// the linker from dropping the plugin crate. Either way the entry must be registered: a
/// `static` that is not in the registry is refused (the backends find entries by name, so an
/// unregistered one could silently stand for another).
#[derive(Debug)]
pub enum Registered<E: 'static> {
    /// A registered name, e.g. `"fenwick"`.
    Name(String),
    /// A registered entry, e.g. `&mixers_plugin_fibonacci::LOG_DISTANCE`.
    Entry(&'static E),
}

/// An offset pattern by name or by value (MATH §1.1).
pub type PatternRef = Registered<PatternEntry>;
/// A level mask by name or by value (MATH §2.3).
pub type MaskRef = Registered<MaskEntry>;
/// A λ scheme by name or by value (MATH §2.4).
pub type LambdaRef = Registered<LambdaEntry>;

/// The registry side of an entry type: its kind, its name, and lookup by name.
pub trait RegistryEntry: Sized + 'static {
    /// What the entry is, for messages (`"pattern"`).
    const KIND: &'static str;
    /// The registered name.
    fn entry_name(&self) -> &'static str;
    /// The registered entry of that name.
    fn lookup(name: &str) -> Result<&'static Self>;
}

impl RegistryEntry for PatternEntry {
    const KIND: &'static str = "pattern";
    fn entry_name(&self) -> &'static str {
        self.name
    }
    fn lookup(name: &str) -> Result<&'static Self> {
        mixer_registry::pattern(name)
    }
}

impl RegistryEntry for MaskEntry {
    const KIND: &'static str = "mask";
    fn entry_name(&self) -> &'static str {
        self.name
    }
    fn lookup(name: &str) -> Result<&'static Self> {
        mixer_registry::mask(name)
    }
}

impl RegistryEntry for LambdaEntry {
    const KIND: &'static str = "λ scheme";
    fn entry_name(&self) -> &'static str {
        self.name
    }
    fn lookup(name: &str) -> Result<&'static Self> {
        mixer_registry::lambda_scheme(name)
    }
}

impl<E: RegistryEntry> Registered<E> {
    /// The registered name, after checking that the entry is registered (a name with a
    /// "did you mean" error; a `static` by identity with its registered namesake). `mixer`
    /// names the caller in errors.
    pub fn resolve(&self, mixer: &str) -> Result<&'static str> {
        match self {
            Registered::Name(n) => E::lookup(n).map(|e| e.entry_name()),
            Registered::Entry(e) => {
                let name = e.entry_name();
                match E::lookup(name) {
                    Ok(found) if std::ptr::eq(found, *e) => Ok(name),
                    Ok(_) => Err(Error::config(
                        mixer,
                        format!(
                            "the {} `{name}` given by value is not the registered `{name}`; register it with \
                             #[register] under a name of its own",
                            E::KIND
                        ),
                    )),
                    Err(_) => Err(Error::config(
                        mixer,
                        format!(
                            "the {} `{name}` given by value is not registered; add #[register] to its static",
                            E::KIND
                        ),
                    )),
                }
            }
        }
    }
}

impl<E> Clone for Registered<E> {
    fn clone(&self) -> Self {
        match self {
            Registered::Name(n) => Registered::Name(n.clone()),
            Registered::Entry(e) => Registered::Entry(*e),
        }
    }
}

impl<E> From<&str> for Registered<E> {
    fn from(s: &str) -> Self {
        Registered::Name(s.to_string())
    }
}

impl<E> From<String> for Registered<E> {
    fn from(s: String) -> Self {
        Registered::Name(s)
    }
}

impl From<&'static PatternEntry> for PatternRef {
    fn from(e: &'static PatternEntry) -> Self {
        Registered::Entry(e)
    }
}

impl From<&'static MaskEntry> for MaskRef {
    fn from(e: &'static MaskEntry) -> Self {
        Registered::Entry(e)
    }
}

impl From<&'static LambdaEntry> for LambdaRef {
    fn from(e: &'static LambdaEntry) -> Self {
        Registered::Entry(e)
    }
}

/// Options of a typed operation. [`Options::default()`] is the fast form on
/// [`Backend::auto()`] in exact arithmetic, with every per-family setting at its mixer's
/// default; set fields with the builder methods:
///
/// ```
/// use mixers::ops::Options;
/// use mixers::prelude::*;
/// let opts = Options::default().form(Form::Parallel).chunk(16).scale(0.5).mask("fenwick").lambda("softplus");
/// assert_eq!(opts.form, Form::Parallel);
/// ```
///
/// A per-family setting given to a mixer it does not apply to is an error (not ignored):
/// `chunk` applies to the log-linear family, `scale` to attention and the log-linear family,
/// `window` to attention, `mask` and `lambda` to the `loglinear_*` lifts.
///
/// Inputs and outputs are host arrays for now; device tensors (a GPU model that never leaves
/// the device) are planned and not available yet. The struct is non-exhaustive so that such
/// settings can be added without breaking callers.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// The form to compute (default [`Form::Fast`]). [`Form::Recurrent`] runs the decoder
    /// over the whole sequence; the typed decoders are the token-by-token interface.
    pub form: Form,
    /// The backend; `None` (default) is [`Backend::auto()`], resolved at each call.
    pub backend: Option<Backend>,
    /// The arithmetic (default [`Precision::Exact`]).
    pub precision: Precision,
    /// Chunk size of the log-linear fast form (a power of two; default 64).
    pub chunk: Option<usize>,
    /// Score/output scale σ (attention default `1/√(D_k)`, log-linear default 1).
    pub scale: Option<f64>,
    /// Attention window `w`: token `t` sees `s ∈ (t − w, t]` (default: every `s ≤ t`).
    pub window: Option<usize>,
    /// Level mask of a log-linear lift (default `"fenwick"`).
    pub mask: Option<MaskRef>,
    /// λ scheme of a log-linear lift (default `"identity"`: λ used as given).
    pub lambda: Option<LambdaRef>,
    /// Packed variable-length batch: sequence `i` at rows `cu_seqlens[i] .. cu_seqlens[i+1]`
    /// of a batch of one row (docs/math.md §7.2); `None` (default): every batch row is one
    /// sequence.
    pub cu_seqlens: Option<Vec<usize>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            form: Form::Fast,
            backend: None,
            precision: Precision::Exact,
            chunk: None,
            scale: None,
            window: None,
            mask: None,
            lambda: None,
            cu_seqlens: None,
        }
    }
}

impl Options {
    /// The defaults (same as [`Options::default()`]).
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the form.
    pub fn form(mut self, form: Form) -> Self {
        self.form = form;
        self
    }
    /// Sets the backend (instead of [`Backend::auto()`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }
    /// Sets the precision.
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }
    /// Sets the chunk size of the log-linear fast form.
    pub fn chunk(mut self, chunk: usize) -> Self {
        self.chunk = Some(chunk);
        self
    }
    /// Sets the scale σ.
    pub fn scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }
    /// Sets the attention window.
    pub fn window(mut self, window: usize) -> Self {
        self.window = Some(window);
        self
    }
    /// Sets the level mask of a log-linear lift, by name or by value.
    pub fn mask(mut self, mask: impl Into<MaskRef>) -> Self {
        self.mask = Some(mask.into());
        self
    }
    /// Sets the λ scheme of a log-linear lift, by name or by value.
    pub fn lambda(mut self, lambda: impl Into<LambdaRef>) -> Self {
        self.lambda = Some(lambda.into());
        self
    }

    /// Packs several sequences into one batch row: sequence `i` at rows
    /// `cu_seqlens[i] .. cu_seqlens[i + 1]` (`B = 1`; rows past the last offset get zeros).
    /// Every sequence restarts; with a state (the `*_state` functions), one state row per
    /// sequence.
    pub fn cu_seqlens(mut self, cu_seqlens: &[usize]) -> Self {
        self.cu_seqlens = Some(cu_seqlens.to_vec());
        self
    }

    /// The backend to run on: the one set, else [`Backend::auto()`].
    pub fn resolve_backend(&self) -> Result<Backend> {
        match self.backend {
            Some(b) => Ok(b),
            None => Backend::auto(),
        }
    }

    /// Fails when a per-family setting outside `allowed` is set, naming the mixer; also
    /// checks that a given scale is finite.
    pub(crate) fn only(&self, mixer: &str, allowed: &[&str]) -> Result<()> {
        if let Some(s) = self.scale
            && !s.is_finite()
        {
            return Err(Error::config(mixer, format!("option `scale` must be finite, got {s}")));
        }
        let set = [
            ("chunk", self.chunk.is_some()),
            ("scale", self.scale.is_some()),
            ("window", self.window.is_some()),
            ("mask", self.mask.is_some()),
            ("lambda", self.lambda.is_some()),
        ];
        for (name, is_set) in set {
            if is_set && !allowed.contains(&name) {
                let takes = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
                return Err(Error::config(
                    mixer,
                    format!("option `{name}` does not apply to this mixer (its options: {takes})"),
                ));
            }
        }
        Ok(())
    }
}
