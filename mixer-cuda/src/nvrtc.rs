//! One NVRTC compilation of a kernel source: its PTX and, for a real architecture (`sm_XY`),
//! the CUBIN that NVRTC's own assembler produced.
//!
//! The runtime loads the PTX by default, and the driver assembles it again (its cache keeps the
//! result on that machine). Loading NVRTC's CUBIN instead skips that second assembly, which is
//! likely most of a process's compile time on a machine with an empty driver cache (the GPU test
//! binary ran 200–330 s on a machine's first run, 75 s on the next). Since the two assemblers
//! may differ in version, and so in the code they emit, the CUBIN is loaded only when
//! `MIXERS_NVRTC_CUBIN=1` until both its start-up time and its kernels' speed are measured.

use std::ffi::{CString, c_char};

use cudarc::nvrtc::{Ptx, result, sys};

/// Environment variable that makes the runtime load NVRTC's CUBIN (`1`) rather than its PTX.
pub const CUBIN_ENV: &str = "MIXERS_NVRTC_CUBIN";

/// Whether [`CUBIN_ENV`] asks for CUBINs.
pub fn cubin_wanted() -> bool {
    std::env::var(CUBIN_ENV).is_ok_and(|v| v == "1")
}

/// What one compilation produced: the PTX (absent where NVRTC gave none) and, when asked for
/// and the architecture is a real one, the CUBIN.
pub struct Compiled {
    /// PTX text.
    pub ptx: Option<Ptx>,
    /// ELF image for the architecture of the `--gpu-architecture=sm_XY` option.
    pub cubin: Option<Vec<u8>>,
}

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed once, here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Compiles `src` (called `name` in NVRTC's messages) with `options`, taking the CUBIN too when
/// `want_cubin`. The error is a message with NVRTC's status, the options and its log. Calls
/// into the NVRTC library: check that it exists first (a missing symbol panics).
pub fn compile(src: &str, name: &str, options: &[String], want_cubin: bool) -> Result<Compiled, String> {
    let csrc = CString::new(src).map_err(|_| "the kernel source contains a NUL byte".to_string())?;
    let cname = CString::new(name).map_err(|_| "the kernel name contains a NUL byte".to_string())?;
    let prog = Program(result::create_program(&csrc, Some(&cname)).map_err(|e| format!("NVRTC: {e:?}"))?);
    // SAFETY: `prog` is a live program; the options are plain strings.
    if let Err(e) = unsafe { result::compile_program(prog.0, options) } {
        // SAFETY: as above; the log is NUL-terminated by NVRTC.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| c_text(&l))
            .unwrap_or_else(|_| "(no log)".to_string());
        return Err(format!("NVRTC compilation failed ({e:?}) with options {options:?}:\n{log}"));
    }
    // SAFETY: the program compiled.
    let ptx = unsafe { result::get_ptx(prog.0) }.ok().map(|p| Ptx::from_src(c_text(&p)));
    let cubin = if want_cubin { cubin(&prog) } else { None };
    Ok(Compiled { ptx, cubin })
}

/// The program's CUBIN, or `None` (a virtual architecture, or NVRTC gave none).
fn cubin(prog: &Program) -> Option<Vec<u8>> {
    let mut n = 0usize;
    // SAFETY: a compiled program; `n` receives the size.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut n) }.result().ok()?;
    if n == 0 {
        return None;
    }
    let mut image = vec![0u8; n];
    // SAFETY: `image` holds the `n` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast::<c_char>()) }.result().ok()?;
    Some(image)
}

/// NUL-terminated bytes from NVRTC as text.
fn c_text(bytes: &[c_char]) -> String {
    let bytes: Vec<u8> = bytes.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
