//! AMX-INT8 tiles for the super-block formats' prompts, behind a trait with the real instructions
//! (`Hw`, inline assembly) and an exact emulation (`Emu`, on any CPU: how the logic is tested here).
//!
//! One sub-block of 32 values per product: `tdpbsud` multiplies an A tile of 16 activation rows x 32
//! signed codes by a B tile of 8 rows x 64 unsigned bytes (row g holds, for each of a panel's 16
//! outputs, the 4 weight codes of k = 4g..4g + 4: exactly `superblock`'s unpacked codes of one
//! sub-block), into a C tile of 16 x 16 i32 sums. With one activation scale per 32 values the sums of
//! different sub-blocks cannot be added before the float epilogue, so each product spans one sub-block
//! (K = 32) and the A tile is configured 32 bytes wide.
//!
//! Tiles: C[j] = tmm j (j < 2), A = tmm4, B[j] = tmm 6 + j.
//!
//! Numerical contract of `dp`: C[j][m][n] += sum over k < 32 of i8(A[m][k]) * u8(B[k / 4][4 n + k % 4]),
//! exact in i32 (|sum| < 32 * 128 * 255 per product), the SDM's TDPBSUD semantics.

use super::{ROWS, ROW_BYTES};

/// Bytes of a row of the A tile: one sub-block of activation codes.
pub(crate) const A_BYTES: usize = 32;
/// Rows of a B tile: groups of 4 codes in a sub-block.
pub(crate) const B_ROWS: usize = A_BYTES / 4;

/// The int8 tile operations (fixed roles, see the module header).
///
/// # Safety
/// `configure` precedes every other call and `release` ends the run; loads read `ROWS` rows of
/// `A_BYTES` (A) or `B_ROWS` rows of `ROW_BYTES` (B, contiguous) bytes; `store_c` writes 16 x 16 i32.
pub(crate) trait IntTiles {
    unsafe fn configure(&mut self);
    unsafe fn release(&mut self);
    /// Zeroes C[0] and C[1].
    unsafe fn zero_c(&mut self);
    /// Loads A: row m from `p + m * stride`.
    unsafe fn load_a(&mut self, p: *const u8, stride: usize);
    /// Loads B[j] (j < 2) from `B_ROWS` contiguous rows of `ROW_BYTES` at `p`.
    unsafe fn load_b(&mut self, j: usize, p: *const u8);
    /// C[j] += A x B[j] (`tdpbsud`), j < 2.
    unsafe fn dp(&mut self, j: usize);
    /// Stores C[j] as 16 rows of 16 i32 at `p` (contiguous).
    unsafe fn store_c(&mut self, j: usize, p: *mut i32);
}

/// Whether this process can run the int8 tiles: `amx::usable()` (tile state granted) and AMX-INT8.
pub fn usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID.(7, 0):EDX bit 25 is AMX-INT8; usable() has checked the leaf exists. Cached: every
        // quantized linear asks, and under a hypervisor each CPUID is a VM exit (measured: 16-row int4
        // linears 10-15 % slower on a KVM Xeon while this was asked per call).
        static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *USABLE.get_or_init(|| {
            super::usable() && std::arch::x86_64::__cpuid_count(7, 0).edx >> 25 & 1 == 1
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The hardware tiles. Construct only after `usable()` returned true.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Hw;

#[cfg(target_arch = "x86_64")]
impl IntTiles for Hw {
    unsafe fn configure(&mut self) {
        // Palette 1; C tiles 16 x 64 bytes, A 16 x 32, B 8 x 64.
        let tiles = [
            (0, ROWS, ROW_BYTES),
            (1, ROWS, ROW_BYTES),
            (4, ROWS, A_BYTES),
            (6, B_ROWS, ROW_BYTES),
            (7, B_ROWS, ROW_BYTES),
        ];
        // SAFETY: AMX-INT8 usable (constructor's contract); valid palette-1 tile shapes.
        unsafe { super::TileConfig::new(&tiles).load() }
    }
    unsafe fn release(&mut self) {
        // SAFETY: AMX usable (constructor's contract).
        unsafe { super::release_tiles() }
    }
    unsafe fn zero_c(&mut self) {
        // SAFETY: tiles configured (trait contract).
        unsafe {
            std::arch::asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                options(nostack, nomem, preserves_flags)
            )
        }
    }
    unsafe fn load_a(&mut self, p: *const u8, stride: usize) {
        // SAFETY: tiles configured; p addresses ROWS rows of A_BYTES, stride apart (trait contract).
        unsafe {
            std::arch::asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly, preserves_flags))
        }
    }
    unsafe fn load_b(&mut self, j: usize, p: *const u8) {
        let s = ROW_BYTES;
        // SAFETY: tiles configured; p addresses B_ROWS contiguous rows of ROW_BYTES (trait contract).
        unsafe {
            match j {
                0 => std::arch::asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) p, s = in(reg) s,
                    options(nostack, readonly, preserves_flags)),
                _ => std::arch::asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) p, s = in(reg) s,
                    options(nostack, readonly, preserves_flags)),
            }
        }
    }
    unsafe fn dp(&mut self, j: usize) {
        // SAFETY: tiles configured and loaded; AMX-INT8 checked by usable().
        unsafe {
            match j {
                0 => std::arch::asm!(
                    "tdpbsud tmm0, tmm4, tmm6",
                    options(nostack, nomem, preserves_flags)
                ),
                _ => std::arch::asm!(
                    "tdpbsud tmm1, tmm4, tmm7",
                    options(nostack, nomem, preserves_flags)
                ),
            }
        }
    }
    unsafe fn store_c(&mut self, j: usize, p: *mut i32) {
        let s = ROW_BYTES;
        // SAFETY: tiles configured; p addresses 16 writable rows of 64 bytes (trait contract).
        unsafe {
            match j {
                0 => {
                    std::arch::asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) p, s = in(reg) s,
                    options(nostack, preserves_flags))
                }
                _ => {
                    std::arch::asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) p, s = in(reg) s,
                    options(nostack, preserves_flags))
                }
            }
        }
    }
}

/// The int8 tiles emulated in memory with TDPBSUD's semantics: how kernels written over `IntTiles` are
/// tested on CPUs without AMX (the instruction itself runs as `Hw` where the CPU has it).
pub(crate) struct Emu {
    a: [[i8; A_BYTES]; ROWS],
    b: [[[u8; ROW_BYTES]; B_ROWS]; 2],
    c: [[[i32; 16]; ROWS]; 2],
    configured: bool,
}

impl Emu {
    pub(crate) fn new() -> Emu {
        Emu {
            a: [[0; A_BYTES]; ROWS],
            b: [[[0; ROW_BYTES]; B_ROWS]; 2],
            c: [[[0; 16]; ROWS]; 2],
            configured: false,
        }
    }
}

impl IntTiles for Emu {
    unsafe fn configure(&mut self) {
        *self = Emu::new();
        self.configured = true;
    }
    unsafe fn release(&mut self) {
        self.configured = false;
    }
    unsafe fn zero_c(&mut self) {
        assert!(self.configured, "AMX int8 emulation: used before configure");
        self.c = [[[0; 16]; ROWS]; 2];
    }
    unsafe fn load_a(&mut self, p: *const u8, stride: usize) {
        assert!(self.configured, "AMX int8 emulation: used before configure");
        for (m, row) in self.a.iter_mut().enumerate() {
            for (k, v) in row.iter_mut().enumerate() {
                // SAFETY: the trait contract: row m's A_BYTES bytes at p + m * stride are readable.
                *v = unsafe { *p.add(m * stride + k) } as i8;
            }
        }
    }
    unsafe fn load_b(&mut self, j: usize, p: *const u8) {
        assert!(self.configured, "AMX int8 emulation: used before configure");
        for (g, row) in self.b[j].iter_mut().enumerate() {
            // SAFETY: the trait contract: B_ROWS rows of ROW_BYTES contiguous bytes at p.
            row.copy_from_slice(unsafe {
                std::slice::from_raw_parts(p.add(g * ROW_BYTES), ROW_BYTES)
            });
        }
    }
    unsafe fn dp(&mut self, j: usize) {
        assert!(self.configured, "AMX int8 emulation: used before configure");
        for m in 0..ROWS {
            for n in 0..16 {
                let mut acc = self.c[j][m][n];
                for k in 0..A_BYTES {
                    acc += self.a[m][k] as i32 * self.b[j][k / 4][4 * n + k % 4] as i32;
                }
                self.c[j][m][n] = acc;
            }
        }
    }
    unsafe fn store_c(&mut self, j: usize, p: *mut i32) {
        assert!(self.configured, "AMX int8 emulation: used before configure");
        for (m, row) in self.c[j].iter().enumerate() {
            // SAFETY: the trait contract: 16 x 16 writable i32 at p.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), p.add(16 * m), 16) };
        }
    }
}
