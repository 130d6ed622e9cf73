//! Memory hints: asking for cache lines ahead of their use. A hint never faults and changes no value,
//! so any address (past a buffer's end, or on a CPU without the instruction) is harmless.

/// Prefetches the lines of `bytes` bytes from `at` into L1 (no-op off x86-64).
#[inline(always)]
pub(crate) fn prefetch(at: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in 0..bytes.div_ceil(64) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                at.wrapping_add(64 * line).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, bytes);
}
