//! The process-wide CUDA runtime of this backend: one context on one device (the device's primary
//! context, the one PyTorch uses; device 0 unless [`select_device`] or `MIXERS_CUDA_DEVICE` chose
//! another before first use, so that one process per GPU works) with its own stream, created lazily (after checking that the driver library exists, since cudarc panics when
//! it does not), an NVRTC module cache keyed by (source, options) that compiles different
//! sources on different threads at once ([`crate::once_map`]), host↔device copies of
//! `ndarray` tensors, and the error conversions to [`mixer_core::Error::Backend`].
//!
//! Streams: every launch, copy, memset and FFT of a thread goes to [`Gpu::stream`], the
//! backend's own stream unless the thread runs inside [`on_stream`], which lends it a caller's
//! stream (e.g. PyTorch's current stream, wrapped by [`borrowed_stream`]) for the duration of
//! one call. Work is ordered by the stream alone: cudarc's per-buffer event tracking is turned
//! off for this context, since the backend never makes a stream of its own to order against.
//!
//! Kernels are the sources of [`crate::kernels`], compiled on first use for the device's
//! compute capability (`--gpu-architecture=sm_XY`).
//! Each kernel is written once as a template and exported as `extern "C"` wrappers
//! `name_f32` / `name_f64`; [`GpuReal::SUFFIX`] picks the instantiation.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Display;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};

use cudarc::nvrtc::Ptx;
use mixer_core::{Error, Result};

use crate::once_map::OnceMap;

/// A backend error of a family (or of a kernel source, by its name):
/// `Error::Backend { backend: "cuda", family, message }`.
pub fn err(family: &str, message: impl Display) -> Error {
    Error::Backend { backend: "cuda".into(), family: Some(family.to_string()), message: message.to_string() }
}

/// Key of a compiled module: the full source and the NVRTC options.
type ModuleKey = (String, Vec<String>);
/// A function of a kernel source: (source key, NVRTC options, function name).
type FunctionKey = (String, Vec<String>, String);

/// The lazily created CUDA state shared by every kernel of this backend.
pub struct Gpu {
    /// Context on the device (its primary context).
    pub ctx: Arc<CudaContext>,
    /// The device's ordinal ([`select_device`]).
    pub ordinal: usize,
    /// The backend's own stream: where work goes outside [`on_stream`] ([`Gpu::stream`]).
    own_stream: Arc<CudaStream>,
    /// Compute capability `(major, minor)`.
    pub cc: (i32, i32),
    /// Device name.
    pub name: String,
    /// Number of devices the driver reports.
    pub count: i32,
    /// Shared memory (static and dynamic together) a block may opt in to (227 KiB on sm_90).
    pub smem_optin: usize,
    /// Multiprocessors (132 on the H200).
    pub sms: usize,
    /// Compiled modules; a compilation holds its own key's cell only (threads compiling other
    /// sources go on meanwhile).
    modules: OnceMap<ModuleKey, Arc<CudaModule>>,
    /// Functions of the builtin sources, found without formatting or hashing their text.
    functions: Mutex<HashMap<FunctionKey, CudaFunction>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({}, sm_{}{})", self.name, self.cc.0, self.cc.1)
    }
}

static GPU: OnceLock<std::result::Result<Gpu, String>> = OnceLock::new();
/// The device choice: the ordinal [`select_device`] chose, and whether the backend has started
/// (then `ordinal` is the one it started on).
struct Choice {
    ordinal: Option<usize>,
    started: bool,
}
static CHOICE: Mutex<Choice> = Mutex::new(Choice { ordinal: None, started: false });
/// The environment variable that chooses the device when [`select_device`] was not called.
pub const DEVICE_VAR: &str = "MIXERS_CUDA_DEVICE";

/// Chooses the device (by ordinal, as the driver counts them) on which this process's backend
/// runs, before its first use; once the backend has started, choosing the device it started on
/// is a no-op and any other an error (one process runs on one device: start one process per
/// GPU, as `torch.distributed` does). Without a choice the backend takes `MIXERS_CUDA_DEVICE`,
/// else device 0. An ordinal beyond the devices is reported when the backend starts.
pub fn select_device(ordinal: usize) -> Result<()> {
    CHOICE.lock().map_err(|_| err("runtime", "the device choice's lock is poisoned"))?.select(ordinal)
}

impl Choice {
    /// [`select_device`] on this choice.
    fn select(&mut self, ordinal: usize) -> Result<()> {
        match (self.started, self.ordinal) {
            (false, _) => self.ordinal = Some(ordinal),
            (true, Some(o)) if o == ordinal => {}
            (true, started_on) => {
                return Err(Error::Value {
                    name: "CUDA device".into(),
                    constraint: format!(
                        "the device this process's CUDA backend already started on, {} (one device per \
                         process: run one process per GPU)",
                        started_on.map_or("none".into(), |o| o.to_string())
                    ),
                    found: ordinal.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Marks the backend started and returns the ordinal it starts on: the chosen one, else
    /// `env` (`MIXERS_CUDA_DEVICE`'s value), else 0.
    fn start(&mut self, env: Option<String>) -> std::result::Result<usize, String> {
        self.started = true;
        let o = match (self.ordinal, env) {
            (Some(o), _) => o,
            (None, None) => 0,
            (None, Some(v)) => v.trim().parse::<usize>().map_err(|_| {
                format!("{DEVICE_VAR} must be a device ordinal (a non-negative integer), got {v:?}")
            })?,
        };
        self.ordinal = Some(o);
        Ok(o)
    }
}

/// [`Choice::start`] of the process's choice.
fn start_ordinal() -> std::result::Result<usize, String> {
    let mut c = CHOICE.lock().map_err(|_| "the device choice's lock is poisoned".to_string())?;
    c.start(std::env::var(DEVICE_VAR).ok())
}

fn create() -> std::result::Result<Gpu, String> {
    let ordinal = start_ordinal()?;
    if !culib_present!(driver) {
        return Err("the CUDA driver library (libcuda.so) was not found".into());
    }
    match std::panic::catch_unwind(cudarc::driver::result::init) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("cuInit failed: {e}")),
        Err(_) => return Err("the CUDA driver could not be initialised".into()),
    }
    let count = match CudaContext::device_count() {
        Ok(0) => return Err("the driver reports no CUDA device".into()),
        Ok(n) => n,
        Err(e) => return Err(format!("cannot count devices: {e}")),
    };
    if ordinal >= count as usize {
        return Err(format!(
            "device {ordinal} was chosen, but the driver reports {count} device(s) (0 to {})",
            count - 1
        ));
    }
    let ctx =
        CudaContext::new(ordinal).map_err(|e| format!("cannot create a context on device {ordinal}: {e}"))?;
    let cc = ctx.compute_capability().map_err(|e| format!("cannot read the compute capability: {e}"))?;
    let name = ctx.name().unwrap_or_else(|_| "unknown device".into());
    // SAFETY: the backend creates no stream of its own (`new_stream`), so cudarc never orders
    // buffers across streams by events; all ordering is by the stream a call runs on. Off, no
    // buffer (and no view of a caller's memory) creates events that would never be used.
    unsafe { ctx.disable_event_tracking() };
    let own_stream = ctx.default_stream();
    let optin = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
        .map_err(|e| format!("cannot read the shared memory limit: {e}"))?;
    let smem_optin = (optin.max(0) as usize).max(48 << 10);
    let sms = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| format!("cannot read the multiprocessor count: {e}"))?
        .max(1) as usize;
    Ok(Gpu {
        ctx,
        ordinal,
        own_stream,
        cc,
        name,
        count,
        smem_optin,
        sms,
        modules: OnceMap::new(),
        functions: Mutex::new(HashMap::new()),
    })
}

/// The process-wide GPU state, created on first use; an error says why CUDA is unusable.
pub fn gpu() -> Result<&'static Gpu> {
    GPU.get_or_init(create)
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable { backend: "cuda".into(), reason: reason.clone() })
}

thread_local! {
    static SYNCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The stream lent to this thread by [`on_stream`], if any.
    static LENT: RefCell<Option<Arc<CudaStream>>> = const { RefCell::new(None) };
}

/// `CU_STREAM_PER_THREAD`: the handle that names the calling thread's per-thread default stream
/// (candle's stream for a device made by `Device::new_cuda`), a different stream on every thread.
const PER_THREAD_STREAM: usize = 0x2;

/// The identity of a stream, for what the backend keeps per stream (the pool's free lists, cuFFT
/// plans, uploaded tables, cached spectra): work is ordered only within one stream, so a buffer
/// written on one stream is handed only to later work on the same one. The key is the stream's
/// handle and, for `CU_STREAM_PER_THREAD` (one handle for a different stream on each thread), the
/// calling thread. A destroyed stream's handle can come back for a new stream only once the
/// driver has released it, after the old stream's work has completed, so the handle is enough
/// otherwise. No driver call is made: the key is taken inside CUDA graph capture too, where
/// queries such as `cuStreamGetId` invalidated PyTorch's capture on the H200.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct StreamKey {
    handle: usize,
    thread: Option<std::thread::ThreadId>,
}

impl StreamKey {
    /// The key of `stream` as seen from the calling thread.
    pub fn of(stream: &CudaStream) -> StreamKey {
        let handle = stream.cu_stream() as usize;
        let thread = (handle == PER_THREAD_STREAM).then(|| std::thread::current().id());
        StreamKey { handle, thread }
    }
}

/// Runs `f` with every launch, copy, memset, FFT and pooled buffer of the calling thread on
/// `stream` instead of the backend's own (nested calls restore the outer stream on return,
/// also when `f` panics). The work is enqueued on `stream` and `f` returns without waiting for
/// it; the caller orders it with its own work on that stream. Buffers taken from the pool
/// inside are handed out again only to work on the same stream ([`crate::pool`]).
pub fn on_stream<R>(stream: Arc<CudaStream>, f: impl FnOnce() -> R) -> R {
    scoped(&LENT, stream, f)
}

/// Runs `f` with `value` in the thread-local `slot`, and puts the slot's previous value back on
/// return (also when `f` panics).
pub(crate) fn scoped<T: 'static, R>(
    slot: &'static std::thread::LocalKey<RefCell<Option<T>>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: 'static>(&'static std::thread::LocalKey<RefCell<Option<T>>>, Option<T>);
    impl<T: 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            let prev = self.1.take();
            self.0.with(|s| *s.borrow_mut() = prev);
        }
    }
    let _restore = Restore(slot, slot.with(|s| s.borrow_mut().replace(value)));
    f()
}

/// A stream owned by someone else (a `CUstream` handle, e.g. PyTorch's
/// `torch.cuda.current_stream().cuda_stream`) as a cudarc stream of this backend's context;
/// dropping it leaves the stream alone.
///
/// # Safety
/// `handle` must be a live stream of the backend's device's primary context (or 0, the legacy default
/// stream), and stay alive while the returned stream or work enqueued through it is in use.
pub unsafe fn borrowed_stream(handle: u64) -> Result<Arc<CudaStream>> {
    let g = gpu()?;
    // SAFETY: as the caller promises.
    Ok(unsafe { g.ctx.wrap_borrowed_stream(handle as cudarc::driver::sys::CUstream) })
}

/// Counts one host synchronisation (a wait for the stream, or a device→host copy, which
/// waits for it) on the calling thread.
pub fn count_sync() {
    SYNCS.with(|c| c.set(c.get() + 1));
}

/// How many times the calling thread has waited for the backend's stream: every wait of the
/// backend goes through [`Gpu::sync`] or [`count_sync`], so a test can prove that a stretch
/// of work (a decode loop) never waited. Per thread, so that other threads' work does not
/// count.
pub fn host_syncs() -> u64 {
    SYNCS.with(|c| c.get())
}

/// The CUDA driver's version as `major.minor`, e.g. `13.0`.
pub fn driver_version() -> Option<String> {
    let mut v = 0i32;
    // SAFETY: writes one int; only called once the driver was initialised (`gpu()` succeeded).
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// Whether NVRTC can be loaded (checked before compiling: cudarc panics when it is missing).
fn nvrtc_present() -> bool {
    culib_present!(nvrtc)
}

/// Whether the CUDA library of cudarc's module `$module` (`driver`, `nvrtc`, `cufft`, `nccl`)
/// can be loaded: cudarc panics on the first call into a library it cannot open, so every
/// library is probed before its first use. With the feature `linked` (cudarc's dynamic
/// linking, which candle's `cuda` feature imposes) the libraries are linked into the program,
/// so a running program has them.
macro_rules! culib_present {
    ($module:ident) => {{
        #[cfg(feature = "linked")]
        let present = true;
        // SAFETY: only attempts to dlopen the library; no call into it is made.
        #[cfg(not(feature = "linked"))]
        let present =
            std::panic::catch_unwind(|| unsafe { cudarc::$module::sys::is_culib_present() }).unwrap_or(false);
        present
    }};
}
pub(crate) use culib_present;

impl Gpu {
    /// The stream the calling thread's work goes to: the one lent by [`on_stream`], else the
    /// backend's own.
    pub fn stream(&self) -> Arc<CudaStream> {
        LENT.with(|l| l.borrow().clone()).unwrap_or_else(|| self.own_stream.clone())
    }

    /// The identity of [`Gpu::stream`] ([`StreamKey`]).
    pub fn stream_key(&self) -> StreamKey {
        LENT.with(|l| l.borrow().as_deref().map(StreamKey::of))
            .unwrap_or_else(|| StreamKey::of(&self.own_stream))
    }

    /// The architecture option for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }

    /// Whether this device has Hopper's warpgroup MMA (`wgmma`): compute capability 9.0 exactly,
    /// the `sm_90a` features, which later architectures do not promise.
    pub fn has_wgmma(&self) -> bool {
        self.cc == (9, 0)
    }

    /// The module compiled from `src` (with `extra` NVRTC options), compiled on first use for
    /// this device's compute capability and cached by (source, options). `kernel` names the
    /// source in errors (NVRTC's log is included). An `--gpu-architecture=` option in `extra`
    /// replaces the device's own (e.g. `sm_90a` for `wgmma`).
    pub fn module(&self, kernel: &str, src: &str, extra: &[String]) -> Result<Arc<CudaModule>> {
        const ARCH: &str = "--gpu-architecture=";
        let arch =
            extra.iter().find_map(|o| o.strip_prefix(ARCH)).map_or_else(|| self.arch(), str::to_string);
        let rest: Vec<String> = extra.iter().filter(|o| !o.starts_with(ARCH)).cloned().collect();
        let options = nvrtc_options(&arch, &rest);
        let key = (src.to_string(), options.clone());
        self.modules.get_or_try_insert(key, || {
            let want_cubin = crate::nvrtc::cubin_wanted();
            let compile = |opts: &[String]| compile_checked(kernel, src, opts, want_cubin);
            let load = |ptx: Ptx| {
                self.ctx.load_module(ptx).map_err(|e| err(kernel, format!("loading the module: {e}")))
            };
            let compiled = compile(&options)?;
            // NVRTC's CUBIN when asked for (crate::nvrtc), its PTX when the CUBIN is absent or the
            // driver refuses it.
            let from_cubin = compiled.cubin.map(|c| load(Ptx::from_binary(c)));
            Ok(match (from_cubin, compiled.ptx) {
                (Some(Ok(m)), _) => m,
                (_, Some(ptx)) => load(ptx)?,
                (Some(Err(e)), None) => return Err(e),
                // Some NVRTC versions give no PTX for a real architecture: fall back to the
                // virtual one (the driver then compiles the PTX for this device).
                (None, None) => {
                    let mut virt = options.clone();
                    virt[0] = virt[0].replace("=sm_", "=compute_");
                    let ptx = compile(&virt)?.ptx.ok_or_else(|| err(kernel, "NVRTC gave no PTX"))?;
                    load(ptx)?
                }
            })
        })
    }

    /// The function `name` of the module compiled from `src`.
    pub fn function(&self, kernel: &str, src: &str, extra: &[String], name: &str) -> Result<CudaFunction> {
        let m = self.module(kernel, src, extra)?;
        m.load_function(name)
            .map_err(|e| err(kernel, format!("function `{name}` not found in the module: {e}")))
    }

    /// The function `name` of a builtin kernel source (compiled with `extra` options), cached by
    /// (source name, options, function name): the hot path of every launch, which neither
    /// assembles nor hashes the source text. `kernel` names the caller in errors.
    pub fn kernel(
        &self,
        kernel: &str,
        src: &crate::kernels::KernelSource,
        extra: &[String],
        name: &str,
    ) -> Result<CudaFunction> {
        self.kernel_keyed(kernel, src.name, extra, name, || Ok(src.full()))
    }

    /// The function `name` of the source that `key` stands for (one key, one source text: e.g. a
    /// kernel with a given mask's and λ scheme's device functions spliced in), cached by (key,
    /// options, function name); `src` assembles the text on the first call only.
    pub fn kernel_keyed(
        &self,
        kernel: &str,
        key: &str,
        extra: &[String],
        name: &str,
        src: impl FnOnce() -> Result<String>,
    ) -> Result<CudaFunction> {
        let key: FunctionKey = (key.to_string(), extra.to_vec(), name.to_string());
        {
            let cache = self.functions.lock().map_err(|_| err(kernel, "function cache poisoned"))?;
            if let Some(f) = cache.get(&key) {
                return Ok(f.clone());
            }
        }
        let f = self.function(kernel, &src()?, extra, name)?;
        self.functions.lock().map_err(|_| err(kernel, "function cache poisoned"))?.insert(key, f.clone());
        Ok(f)
    }

    /// Waits for the calling thread's stream ([`Gpu::stream`]) and reports an asynchronous
    /// kernel failure as an error.
    pub fn sync(&self, kernel: &str) -> Result<()> {
        count_sync();
        self.stream().synchronize().map_err(|e| err(kernel, format!("kernel execution failed: {e}")))
    }
}

/// Shared memory kept back from the opt-in limit for the static `__shared__` arrays of the
/// kernels that size their dynamic shared memory by [`max_dynamic_smem`] (each declares less).
const STATIC_SMEM_RESERVE: usize = 8 << 10;

/// Most dynamic shared memory a block of a kernel with under 8 KiB of static shared memory may
/// use on this device (219 KiB on sm_90; 48 KiB, the limit without opting in, where no device
/// is present).
pub(crate) fn max_dynamic_smem() -> usize {
    gpu().map_or(48 << 10, |g| g.smem_optin.saturating_sub(STATIC_SMEM_RESERVE))
}

/// Opts `f` in to all the dynamic shared memory the device allows beside its static shared
/// memory — always the same ceiling for a function, never lowered, because calls from other
/// threads may launch it with more between this call's setting and its launch.
pub(crate) fn opt_in(kernel: &str, f: &CudaFunction) -> Result<()> {
    let g = gpu()?;
    let fixed =
        f.shared_size_bytes().map_err(|e| err(kernel, format!("reading the static shared memory: {e}")))?;
    let limit = g.smem_optin.saturating_sub(fixed.max(0) as usize);
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        limit as i32,
    )
    .map_err(|e| err(kernel, format!("opting in to {limit} bytes of dynamic shared memory: {e}")))
}

/// A 1-D launch of `n` threads in blocks of `block`.
pub fn grid1(n: usize, block: u32) -> LaunchConfig {
    let blocks = n.div_ceil(block as usize).max(1) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Compiles `src` with NVRTC for `arch` (e.g. `sm_90`) without touching a device, returning
/// the PTX size; used to check kernel sources where NVRTC exists but no GPU does.
pub fn compile_only(kernel: &str, src: &str, arch: &str) -> Result<usize> {
    compile_only_with(kernel, src, arch, &[])
}

/// [`compile_only`] with extra NVRTC options (e.g. `-DATT_WGMMA=1`).
pub fn compile_only_with(kernel: &str, src: &str, arch: &str, extra: &[String]) -> Result<usize> {
    Ok(compile_ptx_only(kernel, src, arch, extra)?.to_src().len())
}

/// The PTX NVRTC produces for `arch`: what the runtime loads with `MIXERS_NVRTC_CUBIN=0` (the
/// driver assembles it). No device needed.
pub fn compile_ptx_only(kernel: &str, src: &str, arch: &str, extra: &[String]) -> Result<Ptx> {
    compile_checked(kernel, src, &nvrtc_options(arch, extra), false)?
        .ptx
        .ok_or_else(|| err(kernel, format!("NVRTC gave no PTX for {arch}")))
}

/// The CUBIN NVRTC produces for the real architecture `arch` (e.g. `sm_90`): what the runtime
/// loads by default. No device needed.
pub fn compile_cubin_only(kernel: &str, src: &str, arch: &str, extra: &[String]) -> Result<Vec<u8>> {
    compile_checked(kernel, src, &nvrtc_options(arch, extra), true)?
        .cubin
        .ok_or_else(|| err(kernel, format!("NVRTC gave no CUBIN for {arch}")))
}

/// The NVRTC options of every compilation: the architecture (e.g. `sm_90`), C++17, then `extra`.
fn nvrtc_options(arch: &str, extra: &[String]) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    options.extend(extra.iter().cloned());
    options
}

/// [`crate::nvrtc::compile_cached`] (through the folder of [`crate::nvrtc::cache_dir`]) after
/// checking that NVRTC exists, its panics and messages as errors of `kernel`.
fn compile_checked(
    kernel: &str,
    src: &str,
    options: &[String],
    cubin: bool,
) -> Result<crate::nvrtc::Compiled> {
    if !nvrtc_present() {
        return Err(err(kernel, "the NVRTC library (libnvrtc.so) was not found; kernels cannot be compiled"));
    }
    let dir = crate::nvrtc::cache_dir();
    std::panic::catch_unwind(|| {
        crate::nvrtc::compile_cached(src, &format!("{kernel}.cu"), options, cubin, dir.as_deref())
    })
    .map_err(|_| err(kernel, "NVRTC panicked (missing symbol or invalid source)"))?
    .map_err(|m| err(kernel, m))
}

/// Whether NVRTC can be loaded here (no device needed).
pub fn nvrtc_available() -> bool {
    nvrtc_present()
}

/// Converts a size to the `int` kernels take, with an error when it does not fit.
pub fn int(kernel: &str, what: &str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| err(kernel, format!("{what} = {n} exceeds the kernel's 32-bit index range")))
}

/// Checks that a launch of `n` threads (or elements) stays within 32-bit indexing.
pub fn check_elems(kernel: &str, n: usize) -> Result<()> {
    int(kernel, "element count", n).map(|_| ())
}

/// Launches `$f` on the calling thread's stream ([`Gpu::stream`]) with the given arguments
/// (references), mapping a launch failure to a backend error of `$kernel`.
#[allow(unused_macros)]
macro_rules! launch {
    ($g:expr, $kernel:expr, $f:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        use cudarc::driver::PushKernelArg;
        let func = $f;
        let stream = $g.stream();
        let mut b = stream.launch_builder(&func);
        $( b.arg($arg); )*
        // SAFETY: the argument list matches the kernel's signature in `kernels/*.cu` (types
        // and order); buffers are sized by the caller for the launch's index range.
        unsafe { b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| $crate::runtime::err($kernel, format!("launch: {e}")))
    }};
}
#[allow(unused_imports)]
pub(crate) use launch;

#[cfg(test)]
mod tests {
    use super::Choice;

    /// Before the backend starts a choice may change; the start takes it (else the variable's
    /// ordinal, else 0); afterwards only the ordinal it started on is accepted.
    #[test]
    fn the_device_is_chosen_before_the_start_and_fixed_after() {
        let mut c = Choice { ordinal: None, started: false };
        assert_eq!(c.start(None), Ok(0));
        assert!(c.select(0).is_ok());
        let e = c.select(1).unwrap_err().to_string();
        assert!(e.contains("already started on, 0") && e.contains('1'), "{e}");

        let mut c = Choice { ordinal: None, started: false };
        c.select(3).unwrap();
        c.select(2).unwrap();
        assert_eq!(c.start(Some("5".into())), Ok(2));
        assert!(c.select(2).is_ok() && c.select(3).is_err());

        let mut c = Choice { ordinal: None, started: false };
        assert_eq!(c.start(Some(" 1 ".into())), Ok(1));
        let mut c = Choice { ordinal: None, started: false };
        let e = c.start(Some("gpu1".into())).unwrap_err();
        assert!(e.contains("MIXERS_CUDA_DEVICE") && e.contains("\"gpu1\""), "{e}");
    }
}
