//! The log-linear attention family (docs/math.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts `loglinear-*` by a registered level mask (config `mask`,
//! default `"fenwick"`) with a registered λ scheme (config `lambda_scheme`, default
//! `"identity"`). All six share the kernel key `"loglinear"`.

use mixer_core::mixer::Mixer;
use mixer_core::mixers::loglinear::{Base, LambdaScheme, LevelMask, Lift, LogLinear, LogLinearConfig};
use mixer_core::{Error, Result};

use crate::lookup::{lambda_grad, lambda_scheme, mask};

/// The base mixer and whether it is lifted, from a registered name.
fn parse_name(name: &str) -> Result<(Base, bool)> {
    let (rest, lifted) = match name.strip_prefix("loglinear-") {
        Some(r) => (r, true),
        None => (name, false),
    };
    let base = match rest {
        "attention" | "linear-attention" => Base::LinearAttention,
        "mamba2" => Base::Mamba2,
        "gated-deltanet" => Base::GatedDeltaNet,
        _ => {
            return Err(Error::config(
                name,
                "not a member of the log-linear family (expected linear-attention, mamba2, gated-deltanet or a loglinear-* lift)",
            ));
        }
    };
    if rest == "attention" && !lifted || rest == "linear-attention" && lifted {
        return Err(Error::config(name, "not a registered name of the log-linear family"));
    }
    Ok((base, lifted))
}

/// Builds a member of the family from its registered name and JSON config.
fn build(name: &str, cfg: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    let (base, lifted) = parse_name(name)?;
    let c = LogLinearConfig::parse(name, cfg)?;
    let lift = if lifted {
        let me = mask(c.mask.as_deref().unwrap_or("fenwick"))?;
        let le = lambda_scheme(c.lambda_scheme.as_deref().unwrap_or("identity"))?;
        Some(Lift {
            mask: LevelMask { name: me.name, level: me.level, levels: me.levels },
            lambda: LambdaScheme { name: le.name, map: le.map, grad: lambda_grad(le.name).map(|g| g.grad) },
        })
    } else {
        for (key, v) in [("mask", &c.mask), ("lambda_scheme", &c.lambda_scheme)] {
            if v.is_some() {
                return Err(Error::config(
                    name,
                    format!("`{key}` applies only to the lifted mixers (loglinear-{})", base.name()),
                ));
            }
        }
        None
    };
    Ok(Box::new(LogLinear::new(name, base, lift, c.scale, c.chunk)?))
}

super::mixer_entries! {
    family: "loglinear", build: build;
    LINEAR_ATTENTION = "linear-attention",
        "linear attention y_t = Σ_{s≤t} (q_t·k_s) v_s (docs/math.md §2.1)",
        [r#"{}"#, r#"{"chunk": 16}"#];
    MAMBA2 = "mamba2",
        "Mamba-2 (SSD): y_t = Σ_{s≤t} (q_t·k_s) e^{G_t−G_s} v_s (docs/math.md §2.1)",
        [r#"{}"#, r#"{"chunk": 16}"#];
    GATED_DELTANET = "gated-deltanet",
        "gated DeltaNet: S_t = e^{g_t} S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, y_t = S_t q_t (docs/math.md §2.1)",
        [r#"{}"#, r#"{"chunk": 16}"#];
    LOGLINEAR_ATTENTION = "loglinear-attention",
        "log-linear attention: linear attention weighted by λ_t^{(ℓ(t,s))} per Fenwick level (docs/math.md §2.3)",
        [r#"{}"#, r#"{"chunk": 16}"#, r#"{"chunk": 8, "lambda_scheme": "softplus"}"#];
    LOGLINEAR_MAMBA2 = "loglinear-mamba2",
        "log-linear Mamba-2: (QKᵀ ⊙ Mˢ ⊙ Mᴴ)V with the Fenwick level mask Mᴴ (docs/math.md §2.3)",
        [r#"{}"#, r#"{"chunk": 16}"#, r#"{"chunk": 8, "scale": 0.5}"#];
    LOGLINEAR_GATED_DELTANET = "loglinear-gated-deltanet",
        "log-linear gated DeltaNet: the delta-rule transition on every Fenwick level's state (docs/math.md §2.3)",
        [r#"{}"#, r#"{"chunk": 16}"#, r#"{"chunk": 8}"#];
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn builds_all_six_and_rejects_bad_configs() {
        for n in mixer_core::mixers::loglinear::MEMBERS {
            let m = crate::mixer(n, &json!({})).unwrap();
            assert_eq!(m.family(), "loglinear");
            assert_eq!(m.name(), n);
        }
        let e = crate::mixer("mamba2", &json!({"mask": "fenwick"})).unwrap_err().to_string();
        assert!(e.contains("lifted"), "{e}");
        let e = crate::mixer("loglinear-mamba2", &json!({"mask": "fenwik"})).unwrap_err().to_string();
        assert!(e.contains("did you mean `fenwick`"), "{e}");
        let e = crate::mixer("loglinear-mamba2", &json!({"chunk": 48})).unwrap_err().to_string();
        assert!(e.contains("power of two") && e.contains("48"), "{e}");
        let e = crate::mixer("loglinear-mamba2", &json!({"chunck": 64})).unwrap_err().to_string();
        assert!(e.contains("chunck"), "{e}");
        let m = crate::mixer("loglinear-attention", &json!({"lambda_scheme": "softplus"})).unwrap();
        assert_eq!(m.config()["lambda_scheme"], "softplus");
    }
}
