//! Computational forms of a mixer (docs/math.md §4, "Forms").

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// How a mixer's output is computed. All forms of one mixer must agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Form {
    /// Build `(A, B)` and solve `(I−B)Y = AX` densely in `f64` (the oracle).
    Materialized,
    /// The family's own quadratic form, e.g. `(QKᵀ ⊙ M)V`.
    Parallel,
    /// The sub-quadratic algorithm (sparse recurrence, chunked scan, FFT, streaming softmax).
    Fast,
    /// Token-by-token decoding with a bounded cache or state.
    Recurrent,
}

impl Form {
    /// Every form, in report order.
    pub const ALL: [Form; 4] = [Form::Materialized, Form::Parallel, Form::Fast, Form::Recurrent];

    /// The form's name as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Form::Materialized => "materialized",
            Form::Parallel => "parallel",
            Form::Fast => "fast",
            Form::Recurrent => "recurrent",
        }
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Form {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Form::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| Error::Unknown {
            kind: "form",
            name: s.to_string(),
            suggestions: vec![],
            known: Form::ALL.map(|f| f.name()).join(", "),
        })
    }
}
