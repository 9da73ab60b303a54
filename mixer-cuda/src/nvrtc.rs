//! One NVRTC compilation of a kernel source: its PTX and, for a real architecture (`sm_XY`),
//! the CUBIN that NVRTC's own assembler produced.
//!
//! The runtime loads NVRTC's CUBIN, so the driver does not assemble the PTX a second time; with
//! `MIXERS_NVRTC_CUBIN=0` (or where the CUBIN is absent or refused) it loads the PTX and the
//! driver assembles it (its cache keeps the result on that machine). Measured on the H200 with
//! both caches off: one `mixers check` process of gated DeltaNet bf16 took 19–22 s from the
//! CUBIN against 31–32 s from the PTX (10–30 % less for tf32 and the lifts), and the kernels of
//! six mixers ran equally fast both ways (`mixers bench`, T = 16k).
//!
//! What NVRTC produces is also kept on disk ([`compile_cached`]), keyed by the NVRTC version, the
//! options and the whole source text, so that a later process does not compile the same kernel
//! again: `MIXERS_KERNEL_CACHE=<folder>` (default `$XDG_CACHE_HOME/mixers/nvrtc`, else
//! `~/.cache/mixers/nvrtc`; `off` disables it).

use std::ffi::{CString, c_char};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{Ptx, result, sys};

/// Environment variable that makes the runtime load NVRTC's PTX (`0`) rather than its CUBIN.
pub const CUBIN_ENV: &str = "MIXERS_NVRTC_CUBIN";

/// Whether the runtime loads CUBINs: unless [`CUBIN_ENV`] is `0`.
pub fn cubin_wanted() -> bool {
    cubin_wanted_from(std::env::var(CUBIN_ENV).ok().as_deref())
}

/// [`cubin_wanted`] for a value of [`CUBIN_ENV`] (`None`: unset).
pub fn cubin_wanted_from(value: Option<&str>) -> bool {
    value != Some("0")
}

/// Environment variable naming the folder of compiled kernels kept between processes (`off`:
/// none).
pub const CACHE_ENV: &str = "MIXERS_KERNEL_CACHE";

/// What one compilation produced: the PTX (absent where NVRTC gave none) and, when asked for
/// and the architecture is a real one, the CUBIN.
#[derive(Clone, Debug)]
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

/// The folder of [`CACHE_ENV`], or its default; `None` when it is `off` (or `0`, or empty) or
/// no home folder is known.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k);
    cache_dir_from(var(CACHE_ENV).as_deref(), var("XDG_CACHE_HOME").as_deref(), var("HOME").as_deref())
}

/// [`cache_dir`] for the values of [`CACHE_ENV`], `XDG_CACHE_HOME` and `HOME` (`None`: unset).
pub fn cache_dir_from(
    cache: Option<&std::ffi::OsStr>,
    xdg: Option<&std::ffi::OsStr>,
    home: Option<&std::ffi::OsStr>,
) -> Option<PathBuf> {
    match cache {
        Some(v) if v.is_empty() || v == "off" || v == "0" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => xdg
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("mixers").join("nvrtc")),
    }
}

/// [`compile`] through the cache folder `dir` (none: no cache). An entry holds the whole key —
/// NVRTC's version, the name, the options, the source — and is used only when that key matches exactly
/// (and holds a CUBIN when one is wanted); anything unreadable counts as absent. A successful
/// compilation is written (to a temporary file, then renamed); a cache that cannot be written
/// is skipped. Errors are never cached.
pub fn compile_cached(
    src: &str,
    name: &str,
    options: &[String],
    want_cubin: bool,
    dir: Option<&Path>,
) -> Result<Compiled, String> {
    let Some(dir) = dir else {
        return compile(src, name, options, want_cubin);
    };
    let key = cache_key(src, name, options);
    let path = dir.join(format!("{:016x}.nvrtc", {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        h.finish()
    }));
    if let Some(c) = read_entry(&path, &key).filter(|c| !want_cubin || c.cubin.is_some()) {
        return Ok(Compiled { cubin: if want_cubin { c.cubin } else { None }, ..c });
    }
    let c = compile(src, name, options, want_cubin)?;
    let _ = write_entry(dir, &path, &key, &c);
    Ok(c)
}

/// NVRTC's version, the program's name (it can appear in the PTX's debug lines), the options (one
/// per line) and the source, as one byte string.
fn cache_key(src: &str, name: &str, options: &[String]) -> Vec<u8> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters; callers checked that NVRTC is loaded.
    let _ = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    let mut key = format!("nvrtc {major}.{minor}\n{name}\n").into_bytes();
    for o in options {
        key.extend_from_slice(o.as_bytes());
        key.push(b'\n');
    }
    key.push(0);
    key.extend_from_slice(src.as_bytes());
    key
}

const MAGIC: &[u8; 8] = b"mxnvrtc1";

/// An entry: MAGIC, then the key, the PTX and the CUBIN, each as a little-endian u64 length and
/// its bytes (length 0: absent).
fn read_entry(path: &Path, key: &[u8]) -> Option<Compiled> {
    let bytes = std::fs::read(path).ok()?;
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (stored, rest) = field(rest)?;
    if stored != key {
        return None;
    }
    let (ptx, rest) = field(rest)?;
    let (cubin, rest) = field(rest)?;
    if !rest.is_empty() {
        return None;
    }
    let ptx = if ptx.is_empty() { None } else { Some(Ptx::from_src(String::from_utf8(ptx.to_vec()).ok()?)) };
    Some(Compiled { ptx, cubin: (!cubin.is_empty()).then(|| cubin.to_vec()) })
}

/// One length-prefixed field and what follows it.
fn field(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = usize::try_from(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)).ok()?;
    let body = b.get(8..8usize.checked_add(n)?)?;
    Some((body, &b[8 + n..]))
}

fn write_entry(dir: &Path, path: &Path, key: &[u8], c: &Compiled) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let ptx = c.ptx.as_ref().map(|p| p.to_src()).unwrap_or_default();
    let cubin = c.cubin.as_deref().unwrap_or_default();
    // A name of its own per process and call, so that concurrent writers never share a file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{n}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(MAGIC)?;
    for part in [key, ptx.as_bytes(), cubin] {
        f.write_all(&(part.len() as u64).to_le_bytes())?;
        f.write_all(part)?;
    }
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }";

    fn opts(extra: &str) -> Vec<String> {
        let mut o = vec!["--gpu-architecture=sm_90".to_string(), "--std=c++17".to_string()];
        if !extra.is_empty() {
            o.push(extra.to_string());
        }
        o
    }

    fn ptx_text(c: &Compiled) -> String {
        c.ptx.as_ref().expect("PTX").to_src()
    }

    /// `MIXERS_NVRTC_CUBIN`: only `0` turns the CUBIN off.
    #[test]
    fn only_zero_turns_the_cubin_off() {
        assert!(cubin_wanted_from(None));
        assert!(!cubin_wanted_from(Some("0")));
        assert!(cubin_wanted_from(Some("1")));
    }

    /// `MIXERS_KERNEL_CACHE`: a folder is used as given; `off`, `0` and empty disable the
    /// cache; unset, the XDG cache folder, else `~/.cache`, each with `mixers/nvrtc`.
    #[test]
    fn the_cache_folder_follows_the_variable_then_xdg_then_home() {
        use std::ffi::OsStr;
        let (xdg, home) = (Some(OsStr::new("/x")), Some(OsStr::new("/h")));
        assert_eq!(cache_dir_from(Some(OsStr::new("/c")), xdg, home), Some(PathBuf::from("/c")));
        for off in ["off", "0", ""] {
            assert_eq!(cache_dir_from(Some(OsStr::new(off)), xdg, home), None, "{off:?}");
        }
        assert_eq!(cache_dir_from(None, xdg, home), Some(PathBuf::from("/x/mixers/nvrtc")));
        assert_eq!(
            cache_dir_from(None, Some(OsStr::new("")), home),
            Some(PathBuf::from("/h/.cache/mixers/nvrtc"))
        );
        assert_eq!(cache_dir_from(None, None, None), None);
    }

    #[test]
    #[ignore = "needs NVRTC (the CUDA toolkit)"]
    fn the_cache_serves_exact_keys_only_and_survives_damage() {
        if !crate::runtime::nvrtc_available() {
            eprintln!("skipped: NVRTC (libnvrtc.so) not found");
            return;
        }
        let dir = std::env::temp_dir().join(format!("mixers-nvrtc-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let o = opts("");
        let first = compile_cached(SRC, "t.cu", &o, false, Some(&dir)).unwrap();
        assert!(ptx_text(&first).contains(".entry twice"));
        let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(entries.len(), 1, "one entry, no temporary file left: {entries:?}");
        let path = entries[0].clone();
        // A hit is served from the file: plant a marker under the same key.
        let key = cache_key(SRC, "t.cu", &o);
        let marked = Compiled { ptx: Some(Ptx::from_src("// marker")), cubin: None };
        write_entry(&dir, &path, &key, &marked).unwrap();
        assert_eq!(ptx_text(&compile_cached(SRC, "t.cu", &o, false, Some(&dir)).unwrap()), "// marker");
        // Another option or another source is another key: compiled, not the marker.
        let other = compile_cached(SRC, "t.cu", &opts("-DX=1"), false, Some(&dir)).unwrap();
        assert!(ptx_text(&other).contains(".entry twice"));
        let src2 = SRC.replace("2.0f", "3.0f");
        assert!(
            ptx_text(&compile_cached(&src2, "t.cu", &o, false, Some(&dir)).unwrap()).contains(".entry twice")
        );
        // A damaged entry counts as absent and is rewritten.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let again = compile_cached(SRC, "t.cu", &o, false, Some(&dir)).unwrap();
        assert_eq!(ptx_text(&again), ptx_text(&first));
        assert!(read_entry(&path, &key).is_some());
        // An entry without a CUBIN does not serve a call that wants one; the new entry has it.
        let with = compile_cached(SRC, "t.cu", &o, true, Some(&dir)).unwrap();
        assert!(with.cubin.as_ref().is_some_and(|c| c.starts_with(b"\x7fELF")));
        assert_eq!(read_entry(&path, &key).unwrap().cubin, with.cubin);
        // Errors are not cached.
        let bad = "extern \"C\" __global__ void k() { undefined_thing(); }";
        assert!(compile_cached(bad, "b.cu", &o, false, Some(&dir)).unwrap_err().contains("undefined_thing"));
        assert!(compile_cached(bad, "b.cu", &o, false, Some(&dir)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
