//! Flush-to-zero for a scope of one thread.
//!
//! [`FlushToZero`] sets the x86-64 MXCSR bits FTZ (a result below the smallest normal number
//! becomes 0) and DAZ (a subnormal operand reads as 0) and restores the previous MXCSR when
//! dropped. The recurrent states of the decaying mixers pass through the subnormal range
//! before they vanish, and every product with a subnormal operand or result costs a microcode
//! assist on most x86 CPUs (in the log-linear lifts this was about a quarter of the run time
//! at T = 16k). The values changed are below `F::min_positive_value()` in magnitude, the
//! same size as the state entries the chunked forms already drop. Other architectures: a
//! no-op.

/// The guard; see the module documentation. Create it at the start of a task that runs on one
/// thread without nested parallelism, so that the restore happens on the same thread.
pub struct FlushToZero {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

impl FlushToZero {
    /// Turns flush-to-zero on for this thread until the guard is dropped.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let saved = read_csr();
            write_csr(saved | FTZ_DAZ);
            FlushToZero { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushToZero {}
    }
}

impl Drop for FlushToZero {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        write_csr(self.saved);
    }
}

#[cfg(target_arch = "x86_64")]
fn read_csr() -> u32 {
    let mut csr = 0u32;
    // SAFETY: `stmxcsr` stores the 32-bit MXCSR to the given, valid and aligned, address.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags)) };
    csr
}

#[cfg(target_arch = "x86_64")]
fn write_csr(csr: u32) {
    // SAFETY: `ldmxcsr` loads MXCSR from a valid address; the values written are a value read
    // with `stmxcsr`, possibly with the FTZ and DAZ bits set, so no reserved bit is set.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags)) };
}

#[cfg(test)]
mod tests {
    use super::FlushToZero;

    #[test]
    fn subnormal_results_flush_inside_the_scope_only() {
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let half = std::hint::black_box(0.5f32);
        assert!(tiny * half > 0.0);
        {
            let _g = FlushToZero::new();
            let r = std::hint::black_box(tiny) * std::hint::black_box(half);
            #[cfg(target_arch = "x86_64")]
            assert_eq!(r, 0.0);
            #[cfg(not(target_arch = "x86_64"))]
            assert!(r > 0.0);
        }
        assert!(std::hint::black_box(tiny) * std::hint::black_box(half) > 0.0);
    }
}
