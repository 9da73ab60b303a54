//! The library's one error type.

use thiserror::Error;

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the library reports. Each variant says what was expected and what was
/// given; none of them is a panic.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// An input tensor has the wrong shape.
    #[error("input `{name}`: expected shape {expected}, got {got}")]
    Shape { name: String, expected: String, got: String },
    /// A required input is absent.
    #[error("missing input `{name}` (expected {expected}); given: {given}")]
    MissingInput { name: String, expected: String, given: String },
    /// An input is present that the mixer does not take.
    #[error("unexpected input `{name}`; this mixer takes: {expected}")]
    UnexpectedInput { name: String, expected: String },
    /// An input violates a value constraint (e.g. log-decay ≤ 0).
    #[error("input `{name}`: {constraint}, but found {found}")]
    Value { name: String, constraint: String, found: String },
    /// A name was looked up and not found.
    #[error("unknown {kind} `{name}`{}; known: {known}", did_you_mean(.suggestions))]
    Unknown { kind: &'static str, name: String, suggestions: Vec<String>, known: String },
    /// A name was looked up in a link-time registry and not found. Besides near names, says
    /// which plugin crates this binary links: a plugin's names exist only where it is linked.
    #[error(
        "unknown {kind} `{name}`{}; registered: {known}. {}",
        did_you_mean(.suggestions),
        link_hint(.plugins)
    )]
    NotRegistered {
        kind: &'static str,
        name: String,
        suggestions: Vec<String>,
        known: String,
        plugins: Vec<String>,
    },
    /// A name is registered more than once (e.g. a plugin reusing a builtin's name); lookups
    /// refuse it rather than pick one silently. `origins` are the registering modules.
    #[error(
        "{kind} `{name}` is registered {} times, by {}; names must be unique, so rename one of them",
        .origins.len(),
        .origins.iter().map(|o| format!("`{o}`")).collect::<Vec<_>>().join(" and ")
    )]
    Duplicate { kind: &'static str, name: String, origins: Vec<String> },
    /// A configuration value is invalid.
    #[error("invalid config for `{mixer}`: {message}")]
    Config { mixer: String, message: String },
    /// An offset pattern does not meet a requirement (e.g. f(0) = 1 for the lattice).
    #[error("pattern `{pattern}`: {message}")]
    Pattern { pattern: String, message: String },
    /// A form is not implemented by a backend for a mixer.
    #[error(
        "form `{form}` of mixer `{mixer}` is not available on backend `{backend}`; available there: {available}"
    )]
    FormUnavailable { mixer: String, form: String, backend: String, available: String },
    /// A backend cannot be used on this machine.
    #[error("backend `{backend}` is not available: {reason}")]
    BackendUnavailable { backend: String, reason: String },
    /// A failure inside a backend (driver error, NVRTC log, out of memory…).
    #[error("backend `{backend}`{}: {message}", family.as_ref().map(|k| format!(" (family `{k}`)")).unwrap_or_default())]
    Backend { backend: String, family: Option<String>, message: String },
    /// A size (`B`, `T`, …) that a form or decoder needs was not bound.
    #[error("size `{size}` is needed but was not bound (bound sizes: {given})")]
    MissingSize { size: String, given: String },
    /// A decoder was driven wrongly (e.g. past its declared length).
    #[error("decoder: {0}")]
    Decoder(String),
    /// Input/output (files, npz, JSON).
    #[error("{0}")]
    Io(String),
    /// A call whose estimated working memory exceeds the budget (`MIXERS_MAX_MEMORY`, else
    /// the available memory); refused before allocating.
    #[error(
        "{what} needs about {estimate} of working memory, above the limit of {limit} ({budget_from}); use smaller sizes, or set MIXERS_MAX_MEMORY to allow more"
    )]
    OutOfMemory { what: String, estimate: String, limit: String, budget_from: String },
    /// A numerical failure (non-finite result where the input was finite, singular solve…).
    #[error("numerical: {0}")]
    Numerical(String),
}

fn did_you_mean(s: &[String]) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", s.iter().map(|x| format!("`{x}`")).collect::<Vec<_>>().join(" or "))
    }
}

fn link_hint(plugins: &[String]) -> String {
    let linked = if plugins.is_empty() {
        "no plugin crates are linked into this binary".to_string()
    } else {
        format!("plugin crates linked into this binary: {}", plugins.join(", "))
    };
    format!("{linked} (a plugin's names exist only where a binary links it with `use plugin_crate as _;`)")
}

impl Error {
    /// Shorthand for a [`Error::Config`].
    pub fn config(mixer: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config { mixer: mixer.into(), message: message.into() }
    }
    /// Shorthand for a [`Error::Pattern`].
    pub fn pattern(pattern: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Pattern { pattern: pattern.into(), message: message.into() }
    }
    /// Shorthand for a [`Error::Shape`].
    pub fn shape(name: impl Into<String>, expected: impl Into<String>, got: impl Into<String>) -> Self {
        Error::Shape { name: name.into(), expected: expected.into(), got: got.into() }
    }
}

/// Formats a shape as `[2, 7, 3]`.
pub fn fmt_shape(shape: &[usize]) -> String {
    format!("[{}]", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}
