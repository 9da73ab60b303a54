//! Training small models on synthetic tasks (copy, MQAR, multi-hop recall) with any
//! registered mixer, on the CPU; `mixers train` (crate `mixers-cli`, which also plots the
//! curves) and `train/examples/expressivity.rs` drive it.
//! The setting and the results are in `docs/training.md`.
//!
//! - [`tasks`]: seeded generators with disjoint train/test splits;
//! - [`nn`]: the non-mixer pieces (linear, RMSNorm, GELU, gates, cross-entropy), each with
//!   its backward, checked by finite differences;
//! - [`layer`]: a block's mixer layer: coefficients from the input, the mixer's fast form,
//!   and its fast backward through `mixer_registry::backward`;
//! - [`model`]: embedding → pre-norm blocks (mixer + MLP) → head, loss and gradients;
//! - [`optim`]: AdamW with clipping and a warm-up + cosine schedule;
//! - [`fit`]: the loop, evaluation and the run's log;
//! - [`checkpoint`]: save/load as safetensors.
//!
//! ```no_run
//! use mixers_train::{TaskConfig, TaskKind, TrainConfig, train};
//! let cfg = TrainConfig { task: TaskConfig::new(TaskKind::Mqar), mixer: "mamba2".into(), steps: 200, ..TrainConfig::default() };
//! let (model, log) = train(&cfg, &mut |_| {})?;
//! println!("test accuracy {:.3}", log.final_test().accuracy);
//! mixers_train::checkpoint::save(&model, "model.safetensors".as_ref())?;
//! # Ok::<(), mixers::prelude::Error>(())
//! ```

pub mod checkpoint;
pub mod expressivity;
pub mod fit;
pub mod layer;
pub mod model;
pub mod nn;
pub mod optim;
pub mod params;
mod slot_softmax;
pub mod tasks;

// The layers run their mixers on the CPU backend, which registers itself at link time through
// the `mixers` library: naming the crate keeps it linked into every binary that trains.
use mixers as _;

pub use fit::{EvalLog, Event, Metrics, StepLog, TrainConfig, TrainLog, evaluate, train};
pub use model::{Model, ModelConfig};
pub use optim::AdamWConfig;
pub use tasks::{Batch, Split, TaskConfig, TaskKind};
