//! Saving and loading a model: one `.safetensors` file with every parameter (`F64`,
//! little-endian, by name) and the model configuration as JSON in the header's metadata
//! (key `mixers.model_config`), so the file alone rebuilds the model.

use std::collections::HashMap;
use std::path::Path;

use mixer_core::{Error, Result};
use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::model::{Model, ModelConfig};
use super::params::Params;

/// Metadata key holding the model configuration.
pub const CONFIG_KEY: &str = "mixers.model_config";

/// The model as safetensors bytes.
pub fn to_bytes(model: &Model) -> Result<Vec<u8>> {
    let cfg = serde_json::to_string(&model.cfg).map_err(|e| Error::Io(e.to_string()))?;
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = model
        .params
        .iter()
        .map(|(k, a)| (k.clone(), a.shape().to_vec(), a.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views = bytes
        .iter()
        .map(|(k, s, b)| Ok((k.clone(), TensorView::new(Dtype::F64, s.clone(), b).map_err(st)?)))
        .collect::<Result<Vec<_>>>()?;
    let meta = HashMap::from([(CONFIG_KEY.to_string(), cfg)]);
    safetensors::serialize(views, Some(meta)).map_err(st)
}

fn st(e: safetensors::SafeTensorError) -> Error {
    Error::Io(format!("safetensors: {e}"))
}

/// A model from safetensors bytes written by [`to_bytes`] (shapes checked against the
/// configuration).
pub fn from_bytes(bytes: &[u8]) -> Result<Model> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(st)?;
    let cfg =
        meta.metadata().as_ref().and_then(|m| m.get(CONFIG_KEY)).ok_or_else(|| {
            Error::Io(format!("not a mixers checkpoint: no `{CONFIG_KEY}` in the metadata"))
        })?;
    let cfg: ModelConfig =
        serde_json::from_str(cfg).map_err(|e| Error::Io(format!("checkpoint model config: {e}")))?;
    let t = SafeTensors::deserialize(bytes).map_err(st)?;
    let mut params = Params::new();
    for (name, v) in t.tensors() {
        if v.dtype() != Dtype::F64 {
            return Err(Error::Io(format!("checkpoint tensor `{name}` is {:?}, expected F64", v.dtype())));
        }
        let data: Vec<f64> =
            v.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        let a = ArrayD::from_shape_vec(IxDyn(v.shape()), data)
            .map_err(|e| Error::Io(format!("`{name}`: {e}")))?;
        params.insert(name, a);
    }
    Model::from_params(cfg, params)
}

/// Writes `model` to `path`.
pub fn save(model: &Model, path: &Path) -> Result<()> {
    std::fs::write(path, to_bytes(model)?)
        .map_err(|e| Error::Io(format!("cannot write {}: {e}", path.display())))
}

/// Reads a model from `path`.
pub fn load(path: &Path) -> Result<Model> {
    let b = std::fs::read(path).map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    from_bytes(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::{TrainConfig, train};
    use crate::tasks::{Split, TaskConfig, TaskKind};

    #[test]
    fn a_loaded_model_gives_identical_outputs() {
        let cfg = TrainConfig {
            task: TaskConfig { min_len: 2, max_len: 4, alphabet: 4, ..TaskConfig::new(TaskKind::Copy) },
            mixer: "loglinear-mamba2".into(),
            width: 8,
            layers: 1,
            steps: 3,
            batch: 2,
            test_size: 2,
            ..TrainConfig::default()
        };
        let (model, _) = train(&cfg, &mut |_| {}).unwrap();
        let dir = std::env::temp_dir().join(format!("mixers-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        save(&model, &path).unwrap();
        let back = load(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(back.cfg, model.cfg);
        assert_eq!(back.params, model.params);
        let b = cfg.task.batch(5, 3, Split::Test).unwrap();
        let (y1, y2) = (model.logits(&b.tokens, 3).unwrap(), back.logits(&b.tokens, 3).unwrap());
        assert!(y1.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits()));
        // A damaged file is an error, not a panic.
        let bytes = to_bytes(&model).unwrap();
        assert!(from_bytes(&bytes[..bytes.len() / 2]).is_err());
        assert!(from_bytes(b"not a checkpoint").is_err());
    }
}
