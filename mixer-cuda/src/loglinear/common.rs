//! The shared bottom of the log-linear family on CUDA (the twin of the CPU's `common.rs`): the
//! family's name in errors, the base codes and chunk length of its kernels, the shapes and data a
//! launch plan is made for ([`Shape`], [`Storage`], [`Device`]), one kernel launch of a plan
//! ([`Launch`]), the inputs of the chunked form checked and on the device ([`ChunkedInputs`])
//! with the views the kernels take, and the limits every chunk kernel shares.
//!
//! Every file of the family imports from here and from nothing above it, so that a parameter —
//! `Dk`, the chunk length — walks down from the dispatcher (`fast.rs`) through one step's file
//! and never back up.

use std::borrow::Cow;

use cudarc::driver::{CudaFunction, CudaView, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use mixer_core::mixers::loglinear::Base;
use mixer_core::{Error, Precision, Result};
use serde::Serialize;

use crate::kernels::{self, KernelSource};
use crate::pool::Pooled;
use crate::runtime::{err, gpu, int, opt_in};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceScalar, DeviceTensor, DeviceTensors, bf16};

/// Family name in errors.
pub(crate) const FAMILY: &str = "loglinear";

/// Most bytes of chunk states the chunk-parallel forms allocate.
const MAX_TREE_BYTES: usize = 48 << 30;

/// The base code the kernels take.
pub(crate) fn base_code(b: Base) -> i32 {
    match b {
        Base::LinearAttention => 0,
        Base::Mamba2 => 1,
        Base::GatedDeltaNet => 2,
    }
}

/// The element type of the computation (`F` of the forms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Elem {
    /// `f32` (also the bf16 mode's arithmetic).
    F32,
    /// `f64`.
    F64,
}

impl Elem {
    /// The element type of `F`.
    pub fn of<F: GpuReal>() -> Elem {
        if std::mem::size_of::<F>() == 8 { Elem::F64 } else { Elem::F32 }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F64 => 8,
        }
    }

    /// The suffix of the kernels' `extern "C"` instantiations.
    pub fn suffix(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F64 => "f64",
        }
    }

    /// Chunk length of the chunk kernels (`Llc<T>::CH` in `loglinear_common.cuh`): 64 tokens in
    /// f32, 32 in f64.
    pub fn chunk(self) -> usize {
        match self {
            Elem::F32 => 64,
            Elem::F64 => 32,
        }
    }
}

/// How the activations `q`, `k`, `v` reach the form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// As `f32` or `f64` tensors (the element type of the computation).
    Real(Elem),
    /// As bf16 tensors (the bf16 mode, `f32` arithmetic); `aligned`: every row of the three
    /// starts at a multiple of 8 elements (16 bytes), as the bf16 state pass's copies need.
    Bf16 {
        /// Rows 16-byte aligned.
        aligned: bool,
    },
}

impl Storage {
    /// The element type of the computation.
    pub fn elem(self) -> Elem {
        match self {
            Storage::Real(e) => e,
            Storage::Bf16 { .. } => Elem::F32,
        }
    }
}

/// The sizes a plan is made for: `[B, T, H, Dk, Dv]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Batch rows.
    pub b: usize,
    /// Tokens.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Key (and query) head dim.
    pub dk: usize,
    /// Value head dim.
    pub dv: usize,
}

impl Shape {
    /// From `[B, T, H, Dk, Dv]`.
    pub fn new([b, t, h, dk, dv]: [usize; 5]) -> Shape {
        Shape { b, t, h, dk, dv }
    }

    /// `[B, T, H, Dk, Dv]`.
    pub fn dims(self) -> [usize; 5] {
        [self.b, self.t, self.h, self.dk, self.dv]
    }

    /// `B·H`.
    pub fn bh(self) -> usize {
        self.b * self.h
    }

    /// Chunks of `chunk` tokens.
    pub fn chunks(self, chunk: usize) -> usize {
        self.t.div_ceil(chunk)
    }
}

/// What a plan needs of the device: its multiprocessors and the dynamic shared memory a block may
/// use ([`crate::runtime::max_dynamic_smem`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Device {
    /// Multiprocessors.
    pub sms: usize,
    /// Dynamic shared memory per block (bytes).
    pub smem: usize,
}

impl Device {
    /// The NVIDIA H200: 132 multiprocessors, 227 KiB of opt-in shared memory less the 8 KiB kept
    /// for static shared memory.
    pub const H200: Device = Device { sms: 132, smem: 219 << 10 };

    /// This process's device, or where none is present a device with 48 KiB (the limit without
    /// opting in) and one multiprocessor.
    pub fn current() -> Device {
        Device { sms: gpu().map_or(1, |g| g.sms), smem: crate::runtime::max_dynamic_smem() }
    }
}

/// What a launch of a plan does (its place in the chunked form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The scalar-decay members' chunk states (`loglinear_ssd.cu`).
    States,
    /// One level `e ≥ 1` of the tree of chunk states (the lifts).
    Tree {
        /// The level.
        level: usize,
    },
    /// The scan over chunks that leaves the state entering each chunk (no lift).
    Scan,
    /// The chunk states and the scan in one walk over the chunks (no lift, tensor cores).
    Walk,
    /// Gated DeltaNet's WY/UT pieces (`loglinear_wy.cu`).
    Wy,
    /// The per-chunk maps `M_j`, `B_j` of the transition form (`loglinear_state_pass.cu`).
    LiftMaps,
    /// Gated DeltaNet's sequential state pass (`loglinear_state_pass.cu`).
    StatePass,
    /// The outputs (`loglinear_output.cu`).
    Output,
    /// The whole form in one block per (batch, head) (`loglinear_sequential.cu`).
    Sequential,
    /// Gated DeltaNet's chunked backward (`loglinear_backward_chunked.cu`).
    Backward,
}

/// One kernel launch: which function of which source, compiled with which defines, on which grid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Launch {
    /// Its place in the form.
    pub step: Step,
    /// The kernel source (`mixer-cuda/kernels/<source>.cu`).
    pub source: &'static str,
    /// The `extern "C"` function, e.g. `llc_delta_h_tc_f32`.
    pub function: String,
    /// The NVRTC defines, without `-D` (`LLC_DK=64`, …).
    pub defines: Vec<String>,
    /// Grid dims.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory (bytes).
    pub shared_mem: usize,
    /// Whether the function is opted in to the device's whole dynamic shared memory first
    /// ([`crate::runtime::opt_in`]).
    pub opt_in: bool,
    /// The number of input buffers, where the kernel takes it as its last argument
    /// (`llc_delta_h_tc`, `llc_lift_h`; the shared memory above holds that many).
    pub stages: Option<usize>,
}

impl Launch {
    /// A launch of `function` of `source` with `defines` (without `-D`); one block of one thread
    /// until [`Launch::on`] says otherwise.
    pub(crate) fn new(step: Step, source: &KernelSource, function: String, defines: Vec<String>) -> Launch {
        Launch {
            step,
            source: source.name,
            function,
            defines,
            grid: [1, 1, 1],
            block: 1,
            shared_mem: 0,
            opt_in: false,
            stages: None,
        }
    }

    /// With grid `grid`, `block` threads and `shared_mem` bytes of dynamic shared memory.
    pub(crate) fn on(mut self, grid: [usize; 3], block: usize, shared_mem: usize) -> Launch {
        self.grid = grid.map(|g| g as u32);
        self.block = block as u32;
        self.shared_mem = shared_mem;
        self
    }

    /// Opted in to the device's whole dynamic shared memory (when `yes`).
    pub(crate) fn opted_in(mut self, yes: bool) -> Launch {
        self.opt_in = yes;
        self
    }

    /// The compiled function (opted in when the launch says so) and its launch configuration.
    pub(crate) fn function(&self) -> Result<(CudaFunction, LaunchConfig)> {
        let source = kernels::ALL
            .iter()
            .find(|s| s.name == self.source)
            .ok_or_else(|| err(FAMILY, format!("no kernel source `{}`", self.source)))?;
        let options: Vec<String> = self.defines.iter().map(|d| format!("-D{d}")).collect();
        let f = gpu()?.kernel(FAMILY, source, &options, &self.function)?;
        if self.opt_in {
            opt_in(FAMILY, &f)?;
        }
        let cfg = LaunchConfig {
            grid_dim: (self.grid[0], self.grid[1], self.grid[2]),
            block_dim: (self.block, 1, 1),
            shared_mem_bytes: self.shared_mem as u32,
        };
        Ok((f, cfg))
    }
}

/// The error of a launch that a plan's path does not expect (a plan that does not fit its runner:
/// an internal error).
pub(crate) fn unexpected(l: &Launch) -> Error {
    err(
        FAMILY,
        format!("internal: the launch of `{}` ({:?}) does not belong to this step", l.function, l.step),
    )
}

/// The most batch·heads whose `states` chunk states of `Dk × Dv` elements of `elem` take at most
/// a quarter of the device's memory and at most [`MAX_TREE_BYTES`] (what a call that runs in
/// groups of heads gives each group: the rest holds the inputs, their copies for the group and the
/// gradients).
pub(crate) fn max_bh(s: Shape, elem: Elem, states: usize) -> Result<usize> {
    let total =
        gpu()?.ctx.total_mem().map_err(|e| err(FAMILY, format!("reading the device's memory: {e}")))?;
    Ok(MAX_TREE_BYTES.min(total / 4) / (states * s.dk * s.dv * elem.bytes()).max(1))
}

/// The limits of the chunk-parallel kernels: `states` chunk states of `Dk × Dv` elements of
/// `elem` per (batch, head) within [`MAX_TREE_BYTES`], indices within `i32`, `B·H` within a grid
/// dimension.
pub(crate) fn check_sizes(s: Shape, elem: Elem, states: usize) -> Result<()> {
    let Shape { t, dk, dv, .. } = s;
    let bh = s.bh();
    let bytes = bh * states * dk * dv * elem.bytes();
    if bytes > MAX_TREE_BYTES {
        return Err(err(
            FAMILY,
            format!(
                "the chunked form needs {bytes} bytes of chunk states (T = {t}, B·H = {bh}, Dk = {dk}, Dv = {dv}); \
                 at most {MAX_TREE_BYTES} are allocated: run fewer batch rows or heads per call"
            ),
        ));
    }
    int(FAMILY, "B·T·H·max(Dk, Dv)", s.b * t * s.h * dk.max(dv))?;
    if bh > 65535 {
        return Err(err(FAMILY, format!("the chunked form takes B·H ≤ 65535 per call, got {bh}")));
    }
    Ok(())
}

/// `[T, H, Dk, Dv, chunks, B·H]` as the kernels' `int` arguments (an error names the one too large).
pub(crate) fn kernel_ints(v: [usize; 6]) -> Result<[i32; 6]> {
    let names = ["T", "H", "Dk", "Dv", "chunks", "B·H"];
    let mut out = [0; 6];
    for ((o, n), name) in out.iter_mut().zip(v).zip(names) {
        *o = int(FAMILY, name, n)?;
    }
    Ok(out)
}

/// A packed batch's chunk table on the device (`B = 1`, the sequences of `cu_seqlens` one after
/// the other along `T`; `llc_span` in `kernels/loglinear_common.cuh`, docs/math.md §7.2): the
/// chunking restarts at every sequence start, so every chunk of up to 64 tokens lies inside one
/// sequence, and the chunk indices run over all sequences in order.
pub(crate) struct ChunkTable {
    /// `[chunks]` first tokens, `[chunks]` lengths (plus `1 << 16` on a sequence's first chunk),
    /// `[seqs + 1]` every sequence's first chunk, `[seqs]` the sequences by decreasing chunk count
    /// (ties in order): the order in which the passes over chunks start them (`llc_range`).
    pub tab: Pooled<i32>,
    /// Chunks over all sequences.
    pub chunks: usize,
    /// Sequences (empty ones included).
    pub seqs: usize,
    /// The tokens the sequences cover (the last offset).
    pub end: usize,
}

impl ChunkTable {
    /// The chunks of 64 tokens the sequences of the offsets `cu` cut into, over all sequences.
    pub(crate) fn count(cu: &[usize]) -> usize {
        cu.windows(2).map(|w| (w[1] - w[0]).div_ceil(64)).sum()
    }

    /// The table of the offsets `cu` (checked by the caller: non-decreasing from 0) with chunks of
    /// 64 tokens, as the host builds it.
    pub(crate) fn host(cu: &[usize]) -> Result<Vec<i32>> {
        let seqs = cu.len().saturating_sub(1);
        let chunks = ChunkTable::count(cu);
        let (mut start, mut len, mut first) = (Vec::new(), Vec::new(), Vec::with_capacity(seqs + 1));
        for w in cu.windows(2) {
            first.push(int(FAMILY, "chunks", start.len())?);
            for (c, i0) in (w[0]..w[1]).step_by(64).enumerate() {
                start.push(int(FAMILY, "T", i0)?);
                len.push((w[1] - i0).min(64) as i32 | if c == 0 { 1 << 16 } else { 0 });
            }
        }
        first.push(int(FAMILY, "chunks", chunks)?);
        let mut order: Vec<i32> = (0..seqs).map(|s| int(FAMILY, "sequences", s)).collect::<Result<_>>()?;
        order.sort_by_key(|&s| std::cmp::Reverse(first[s as usize + 1] - first[s as usize]));
        Ok([start, len, first, order].concat())
    }

    /// [`ChunkTable::host`] on the device.
    pub(crate) fn upload(cu: &[usize]) -> Result<ChunkTable> {
        let host = ChunkTable::host(cu)?;
        let seqs = cu.len().saturating_sub(1);
        let end = cu.last().copied().unwrap_or(0);
        Ok(ChunkTable {
            chunks: (host.len() - 2 * seqs - 1) / 2,
            seqs,
            end,
            tab: crate::pool::upload(FAMILY, &host)?,
        })
    }
}

/// The output `y` of `n` elements for the output kernel to fill, `per_token` of them a token:
/// with a chunk `table` (a packed batch, `B = 1`) its rows past the last offset zeroed, since no
/// chunk writes them.
pub(crate) fn output_buffer<T: DeviceRepr + ValidAsZeroBits + 'static>(
    table: Option<&ChunkTable>,
    n: usize,
    per_token: usize,
) -> Result<Pooled<T>> {
    let mut y = crate::pool::take::<T>(FAMILY, n)?;
    let from = table.map_or(n, |c| (c.end * per_token).min(n));
    if from < n {
        gpu()?
            .stream()
            .memset_zeros(&mut y.slice_mut(from..n))
            .map_err(|e| err(FAMILY, format!("zeroing the rows past the last offset: {e}")))?;
    }
    Ok(y)
}

/// `plan`'s launches (of a plan for `B = seqs`) on a chunk table of `chunks` chunks over `seqs`
/// sequences of `h` heads: the per-chunk kernels (states, WY, outputs) over its chunks with
/// `B = 1`, the per-(row, head) passes (scan, walk, gated DeltaNet's state pass) over its
/// sequences.
pub(crate) fn table_grids(plan: &[Launch], chunks: usize, seqs: usize, h: usize) -> Vec<Launch> {
    let mut out = plan.to_vec();
    for l in &mut out {
        match l.step {
            Step::States | Step::Wy | Step::Output => l.grid[..2].copy_from_slice(&[chunks as u32, h as u32]),
            Step::Scan | Step::Walk => l.grid[1] = (seqs * h) as u32,
            Step::StatePass => l.grid[0] = (seqs * h) as u32,
            _ => {}
        }
    }
    out
}

/// The kernel arguments `(tab, has_tab)` of a chunk table, or of none (`none`, a one-entry buffer
/// the kernels do not read, and 0).
pub(crate) fn table_args<'a>(
    table: Option<&'a ChunkTable>,
    none: &'a Pooled<i32>,
) -> (CudaView<'a, i32>, i32) {
    match table {
        Some(c) => (c.tab.slice(0..c.tab.len()), 1),
        None => (none.slice(0..1), 0),
    }
}

/// Whether the products run on tensor cores: the tf32 and bf16 modes, with f32 arithmetic.
pub(crate) fn tensor_cores(p: Precision, elem: Elem) -> bool {
    p != Precision::Exact && elem == Elem::F32
}

/// The defines that fix the chunk kernels' head dims at compile time (`LLC_FIX_DIMS` in
/// `loglinear_common.cuh`): one module per (Dk, Dv), compiled on first use.
pub(crate) fn fixed_dims(s: Shape) -> Vec<String> {
    vec![format!("LLC_DK={}", s.dk), format!("LLC_DV={}", s.dv)]
}

/// The inputs of the chunked form, checked and on the device.
pub(crate) struct ChunkedInputs<'a, F: GpuReal> {
    pub q: Cow<'a, DeviceTensor<F>>,
    pub k: Cow<'a, DeviceTensor<F>>,
    pub v: Cow<'a, DeviceTensor<F>>,
    /// `g` (absent: linear attention) and gated DeltaNet's `beta`.
    pub g: Option<Cow<'a, DeviceTensor<F>>>,
    pub beta: Option<Cow<'a, DeviceTensor<F>>>,
    /// The mapped λ weights and their level count (lifts only).
    pub lam: Option<(DeviceTensor<F>, usize)>,
    /// `[B, T, H, Dk, Dv]`.
    pub dims: [usize; 5],
    /// One zero, passed to the kernels in place of an input the mixer does not have (never read).
    pub zero: Pooled<F>,
}

/// An optional input as the kernels take it: its view and 1, or the one-entry `zero` buffer and
/// 0 where it is absent (`has_g`).
pub(crate) fn view_or_zero<'a, T: DeviceScalar>(
    t: Option<&'a DeviceTensor<T>>,
    zero: &'a Pooled<T>,
) -> (CudaView<'a, T>, i32) {
    (t.map_or_else(|| zero.slice(0..1), |d| d.view()), t.is_some() as i32)
}

impl<F: GpuReal> ChunkedInputs<'_, F> {
    /// The sizes.
    pub fn shape(&self) -> Shape {
        Shape::new(self.dims)
    }

    /// `g`, or the zero buffer without a decay, and whether `g` is there (the kernels' `has_g`).
    pub fn g_view(&self) -> (CudaView<'_, F>, i32) {
        view_or_zero(self.g.as_deref(), &self.zero)
    }

    /// `beta`, or the zero buffer without one.
    pub fn beta_view(&self) -> CudaView<'_, F> {
        self.beta.as_ref().map_or_else(|| self.zero.slice(0..1), |d| d.view())
    }

    /// The mapped λ, or the zero buffer without a lift.
    pub fn lam_view(&self) -> CudaView<'_, F> {
        self.lam.as_ref().map_or_else(|| self.zero.slice(0..1), |(d, _)| d.view())
    }
}

/// The bf16 mode's `q`, `k`, `v` as stored and the dims `[B, T, H, Dk, Dv]`, where all three are
/// bf16 (`None` otherwise).
pub(crate) fn bf16_qkv(x: &DeviceTensors) -> Option<([&DeviceTensor<bf16>; 3], [usize; 5])> {
    let (Some(AnyDeviceTensor::Bf16(q)), Some(AnyDeviceTensor::Bf16(k)), Some(AnyDeviceTensor::Bf16(v))) =
        (x.get("q"), x.get("k"), x.get("v"))
    else {
        return None;
    };
    let s = q.shape();
    Some(([q, k, v], [s[0], s[1], s[2], s[3], v.shape()[3]]))
}
