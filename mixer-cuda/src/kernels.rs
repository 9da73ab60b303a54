//! Every CUDA source of this backend, in one table: the `.cu` files under
//! `mixer-cuda/kernels/`, embedded with `include_str!`, each with the helpers of `common.cuh`
//! and the device functions it needs prepended ([`KernelSource::full`]). The families compile
//! from here (through [`crate::runtime::Gpu::function`]) and the NVRTC test compiles every
//! entry of [`ALL`], so a source that is not in the table is neither run nor checked.

/// The helpers every kernel source starts with (`kernels/common.cuh`).
pub const COMMON: &str = include_str!("../kernels/common.cuh");

/// The device functions of the generic log-linear kernel for a mixer without a lift. The
/// kernel does not call them then (`lifted = 0`); they are what the lift reduces to, so that
/// the source means what it says: every token at level 0, and the λ of the `ones` scheme
/// (λ ≡ 1, which turns every lift into its base mixer, MATH §2.4).
pub const NO_LIFT: &str = "__device__ int mixers_level(long long t, long long s) { return 0; }\n\
                           __device__ double mixers_lambda(double raw, double param) { return 1.0; }";

/// One kernel source: a name (used in errors and as the NVRTC file name), the device functions
/// it needs before its body, and the body.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// Name, e.g. `"glr"`.
    pub name: &'static str,
    /// Device functions the body calls but does not define (empty for most).
    pub prelude: &'static str,
    /// The `.cu` file.
    pub body: &'static str,
}

/// Environment variable naming a folder of kernel sources that replace the built-in bodies
/// (`<folder>/<name>.cu`, e.g. `loglinear_output.cu`) — for tuning a kernel without rebuilding;
/// read when a source is first compiled.
pub const KERNEL_DIR_ENV: &str = "MIXERS_KERNEL_DIR";

impl KernelSource {
    /// The complete source: common helpers, prelude, body (the body from
    /// `$MIXERS_KERNEL_DIR/<name>.cu` when that file exists).
    pub fn full(&self) -> String {
        self.full_in(std::env::var_os(KERNEL_DIR_ENV).as_deref().map(std::path::Path::new))
    }

    /// [`KernelSource::full`] for a value of [`KERNEL_DIR_ENV`] (`None`: unset).
    pub fn full_in(&self, dir: Option<&std::path::Path>) -> String {
        let over = dir.and_then(|d| std::fs::read_to_string(d.join(format!("{}.cu", self.name))).ok());
        with_prelude(self.prelude, over.as_deref().unwrap_or(self.body))
    }
}

/// `common.cuh`, then `prelude`, then `body`.
pub fn with_prelude(prelude: &str, body: &str) -> String {
    format!("{COMMON}\n{prelude}\n{body}")
}

/// A [`KernelSource`] named `$name` whose body is the file `kernels/$name.cu` (so the name is
/// always the file's), with `$prelude` before it (empty when not given).
macro_rules! kernel {
    ($name:literal) => {
        kernel!($name, "")
    };
    ($name:literal, $prelude:expr) => {
        KernelSource {
            name: $name,
            prelude: $prelude,
            body: include_str!(concat!("../kernels/", $name, ".cu")),
        }
    };
}

/// What the attention forward sources share (`kernels/attention_common.cuh`): the overflow-free
/// weights and the rows computed again in double where f32 dot products overflow.
pub const ATTENTION_COMMON: &str = include_str!("../kernels/attention_common.cuh");
/// Softmax attention: tiled forward and decoder step (`kernels/attention.cu`).
pub const ATTENTION: KernelSource = kernel!("attention", ATTENTION_COMMON);
/// Softmax attention on tensor cores (the split-tf32 products of the exact mode, tf32 and bf16),
/// fused flash-style: `kernels/attention_fused.cu`, compiled per head dim with `-DATT_D=…`.
pub const ATTENTION_FUSED: KernelSource = kernel!("attention_fused", ATTENTION_COMMON);
/// Softmax attention's backward (`kernels/attention_backward.cu`), compiled per head dims and
/// tile with `-DATB_DK=… -DATB_DV=… -DATB_B=…`.
pub const ATTENTION_BACKWARD: KernelSource = kernel!("attention_backward");
/// Softmax attention's backward on tensor cores (tf32 and bf16 modes,
/// `kernels/attention_backward_fused.cu`), compiled per head dim and tile with `-DATC_D=…
/// -DATC_WARPS=… -DATC_BN=…`.
pub const ATTENTION_BACKWARD_FUSED: KernelSource = kernel!("attention_backward_fused");
/// What the GLR kernel sources share (`kernels/glr_common.cuh`: a tap's position `d_k(t)`): the
/// prelude of [`GLR`] and [`GLR_BACKWARD`].
pub const GLR_COMMON: &str = include_str!("../kernels/glr_common.cuh");
/// The GLR: sparse recurrence and decoder step (`kernels/glr.cu`).
pub const GLR: KernelSource = kernel!("glr", GLR_COMMON);
/// The GLR's backward: the reverse sparse recurrence and the gradients
/// (`kernels/glr_backward.cu`).
pub const GLR_BACKWARD: KernelSource = kernel!("glr_backward", GLR_COMMON);
/// The channel maps the Toeplitz kernel sources share (`kernels/toeplitz_common.cuh`): the
/// prelude of [`TOEPLITZ`] and [`TOEPLITZ_BACKWARD`].
pub const TOEPLITZ_COMMON: &str = include_str!("../kernels/toeplitz_common.cuh");
/// The Toeplitz mixer: direct form, FFT packing and decoder step (`kernels/toeplitz.cu`).
pub const TOEPLITZ: KernelSource = kernel!("toeplitz", TOEPLITZ_COMMON);
/// The Toeplitz mixer's backward: the reductions of `d_w` and `d_bias`
/// (`kernels/toeplitz_backward.cu`).
pub const TOEPLITZ_BACKWARD: KernelSource = kernel!("toeplitz_backward", TOEPLITZ_COMMON);
/// The log-linear family's generic quadratic form and its λ mapping
/// (`kernels/loglinear_parallel.cu`); a lift replaces the prelude with its mask's and λ scheme's
/// registered device functions.
pub const LOGLINEAR_PARALLEL: KernelSource = kernel!("loglinear_parallel", NO_LIFT);
/// The log-linear family's decoder step, one launch per token (`kernels/loglinear_decoder.cu`).
pub const LOGLINEAR_DECODER: KernelSource = kernel!("loglinear_decoder");
/// Gated DeltaNet's chunked form in one block per (batch, head), for states too large for shared
/// memory (`kernels/loglinear_sequential.cu`).
pub const LOGLINEAR_SEQUENTIAL: KernelSource = kernel!("loglinear_sequential");

/// The shared bottom of the log-linear chunk kernels (`kernels/loglinear_common.cuh`): the
/// prelude of [`LOGLINEAR_SSD`], [`LOGLINEAR_WY`], [`LOGLINEAR_STATE_PASS`] and
/// [`LOGLINEAR_OUTPUT`].
pub const LOGLINEAR_COMMON: &str = include_str!("../kernels/loglinear_common.cuh");

/// The chunk states of the scalar-decay members and what joins them: the tree of chunk states
/// (lifts) or the scan over chunks (`kernels/loglinear_ssd.cu`).
pub const LOGLINEAR_SSD: KernelSource = kernel!("loglinear_ssd", LOGLINEAR_COMMON);

/// Gated DeltaNet's WY/UT step, per chunk (`kernels/loglinear_wy.cu`).
pub const LOGLINEAR_WY: KernelSource = kernel!("loglinear_wy", LOGLINEAR_COMMON);

/// Gated DeltaNet's sequential state pass over chunks, every variant (`kernels/loglinear_state_pass.cu`).
pub const LOGLINEAR_STATE_PASS: KernelSource = kernel!("loglinear_state_pass", LOGLINEAR_COMMON);

/// The output step of the chunked form, every member (`kernels/loglinear_output.cu`).
pub const LOGLINEAR_OUTPUT: KernelSource = kernel!("loglinear_output", LOGLINEAR_COMMON);

/// The `fast` backward of linear attention and Mamba-2: the reversals and the decay gradient
/// (`kernels/loglinear_backward.cu`).
pub const LOGLINEAR_BACKWARD: KernelSource = kernel!("loglinear_backward");

/// Gated DeltaNet's chunked backward through the WY/UT form: the state passes, forward and
/// reverse, and the chunk-parallel gradients (`kernels/loglinear_backward_chunked.cu`).
pub const LOGLINEAR_BACKWARD_CHUNKED: KernelSource =
    kernel!("loglinear_backward_chunked", LOGLINEAR_BACKWARD_COMMON);

/// The lifted gated DeltaNet's chunked backward: `Q̃`, the reverse pass over the chunk-level
/// Fenwick states, the level terms and the chunk-parallel gradients
/// (`kernels/loglinear_backward_lift_delta.cu`).
pub const LOGLINEAR_BACKWARD_LIFT_DELTA: KernelSource =
    kernel!("loglinear_backward_lift_delta", LOGLINEAR_BACKWARD_COMMON);

/// What the chunked backward kernels share: [`LOGLINEAR_COMMON`], then
/// `kernels/loglinear_backward_common.cuh` (the FMA chunk products and tile staging).
pub const LOGLINEAR_BACKWARD_COMMON: &str = concat!(
    include_str!("../kernels/loglinear_common.cuh"),
    "\n",
    include_str!("../kernels/loglinear_backward_common.cuh")
);

/// The scalar-decay lifts' backward: the reverse sweep over chunks, the chunk-parallel `dk`, `dv`
/// and `dλ` (`kernels/loglinear_backward_lift.cu`).
pub const LOGLINEAR_BACKWARD_LIFT: KernelSource = kernel!("loglinear_backward_lift", LOGLINEAR_COMMON);

/// Device-tensor helpers: bf16 conversions and input value checks (`kernels/tensor.cu`).
pub const TENSOR: KernelSource = kernel!("tensor");

/// The lifts' `fast` form from a state: a segment's rows of the base run and what is read back
/// from them (`src/loglinear/lift_state.rs`).
pub const LOGLINEAR_LIFT_STATE: KernelSource = kernel!("loglinear_lift_state");

/// Every kernel source of the backend.
pub const ALL: &[KernelSource] = &[
    ATTENTION,
    ATTENTION_FUSED,
    ATTENTION_BACKWARD,
    ATTENTION_BACKWARD_FUSED,
    GLR,
    GLR_BACKWARD,
    TOEPLITZ,
    TOEPLITZ_BACKWARD,
    LOGLINEAR_PARALLEL,
    LOGLINEAR_DECODER,
    LOGLINEAR_SEQUENTIAL,
    LOGLINEAR_SSD,
    LOGLINEAR_WY,
    LOGLINEAR_STATE_PASS,
    LOGLINEAR_OUTPUT,
    LOGLINEAR_BACKWARD,
    LOGLINEAR_BACKWARD_CHUNKED,
    LOGLINEAR_BACKWARD_LIFT,
    LOGLINEAR_BACKWARD_LIFT_DELTA,
    LOGLINEAR_LIFT_STATE,
    TENSOR,
];

#[cfg(test)]
mod tests {
    /// Without a lift the generic kernel is the lift with the `ones` λ scheme (λ ≡ 1): the
    /// prelude's λ function is exactly that scheme's registered device function.
    #[test]
    fn no_lift_prelude_is_the_ones_scheme() {
        let ones = mixer_registry::lambda_scheme("ones").unwrap().cuda.unwrap();
        assert!(super::NO_LIFT.lines().any(|l| l.trim() == ones), "{}", super::NO_LIFT);
        assert_eq!(super::LOGLINEAR_PARALLEL.prelude, super::NO_LIFT);
    }

    /// `MIXERS_KERNEL_DIR`: a file `<name>.cu` in the folder replaces that kernel's body (after
    /// the common header and its prelude); other kernels, and an unset folder, keep theirs.
    #[test]
    fn the_kernel_dir_replaces_only_the_bodies_it_holds() {
        let dir = std::env::temp_dir().join(format!("mixers-kernel-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("loglinear_parallel.cu"), "// replaced body\n").unwrap();
        let k = super::LOGLINEAR_PARALLEL;
        let replaced = k.full_in(Some(&dir));
        assert!(replaced.ends_with("// replaced body\n") && replaced.contains(super::NO_LIFT));
        assert!(!replaced.contains(k.body));
        assert_eq!(k.full_in(None), super::with_prelude(k.prelude, k.body));
        assert_eq!(super::ATTENTION.full_in(Some(&dir)), super::ATTENTION.full_in(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every `.cu` file under `kernels/` is in [`super::ALL`] once, under its file name (so the
    /// NVRTC test compiles every source there is).
    #[test]
    fn every_kernel_file_is_listed() {
        let mut names: Vec<&str> = super::ALL.iter().map(|k| k.name).collect();
        names.sort_unstable();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".cu").map(str::to_string))
            .collect();
        files.sort_unstable();
        assert_eq!(names, files);
    }
}
