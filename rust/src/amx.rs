//! Intel AMX (Advanced Matrix Extensions): detection, the OS permission, and the tile operations
//! the AMX kernels are written with, behind a trait with two implementations:
//! - `Hw`: the real instructions (`ldtilecfg`, `tileloadd`, `tdpbf16ps`, ...) as inline assembly
//!   (Rust has no stable AMX intrinsics). Only called where `usable()` said yes.
//! - `Emu`: the same operations on eight 1 KB arrays, with the SDM's semantics (bf16 products in
//!   float32, odd-even pair order, inputs that are denormal read as zero, denormal results flushed).
//!   Kernels are generic over the trait, so their loops, packing and edges are tested on any CPU;
//!   on an AMX CPU the tests also run them on `Hw` against the scalar reference.
//!
//! One fixed tile layout serves the kernels: every tile is 16 rows x 64 bytes; tmm0-3 hold the
//! float32 (or int32) sums C[i][j] = tmm(2i + j), tmm4-5 the activations A[i], tmm6-7 the
//! weights B[j] (VNNI order: row r of a B tile holds, for 16 outputs, the pair k = 2r, 2r + 1).
//!
//! Numerical contract of `dp_bf16`: C[m][n] += sum over the 16 pairs of A[m][2p] * B[p][2n] +
//! A[m][2p+1] * B[p][2n+1]; each bf16 product is exact in float32 and every sum is rounded to
//! float32 (nearest-even). The hardware's order of those float32 sums is not specified beyond
//! that; the emulation adds the even product first, then the odd, pair after pair.

use std::sync::OnceLock;

pub(crate) mod bf16_gemm;
pub(crate) mod bf16_pack;
pub(crate) mod bf16_split;
#[cfg(target_arch = "x86_64")]
pub(crate) mod dpbf16;
#[cfg(test)]
pub(crate) mod emu;
pub(crate) mod int8;
#[cfg(test)]
pub(crate) use emu::Emu;

/// Rows of every tile.
pub const ROWS: usize = 16;
/// Bytes of every tile row.
pub const ROW_BYTES: usize = 64;

/// Whether this process can run AMX bf16 tiles: the CPU has AMX-TILE and AMX-BF16 with the usual
/// palette (8 tiles of 16 x 64 bytes), the OS saves tile state (XCR0), and Linux granted this
/// process the tile data permission (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, requested once here).
/// Cached: the answer cannot change while the process runs.
pub fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::__cpuid_count;
    let max_leaf = __cpuid_count(0, 0).eax;
    if max_leaf < 0x1e {
        return false;
    }
    let l7 = __cpuid_count(7, 0);
    let (amx_bf16, amx_tile) = (l7.edx >> 22 & 1 == 1, l7.edx >> 24 & 1 == 1);
    let osxsave = __cpuid_count(1, 0).ecx >> 27 & 1 == 1;
    if !(amx_bf16 && amx_tile && osxsave) {
        return false;
    }
    // Palette 1 must exist and be the 8 x (16 rows x 64 bytes) the kernels configure, and the
    // multiplier must take 16 rows of 64 bytes (leaf 0x1e: tmul_maxk, tmul_maxn).
    let tmul = __cpuid_count(0x1e, 0).ebx;
    if __cpuid_count(0x1d, 0).eax < 1 || (tmul & 0xff) < ROWS as u32 || (tmul >> 8 & 0xffff) < 64 {
        return false;
    }
    let palette = __cpuid_count(0x1d, 1);
    let (bytes_per_row, names, max_rows) = (
        palette.ebx & 0xffff,
        palette.ebx >> 16,
        palette.ecx & 0xffff,
    );
    if bytes_per_row < ROW_BYTES as u32 || names < 8 || max_rows < ROWS as u32 {
        return false;
    }
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves tile state across switches.
    let (lo, _hi): (u32, u32);
    // SAFETY: xgetbv with ecx = 0 is valid when OSXSAVE is set (checked above).
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi,
            options(nomem, nostack, preserves_flags));
    }
    if lo >> 17 & 3 != 3 {
        return false;
    }
    // Linux hands out tile data state per process on request (ARCH_REQ_XCOMP_PERM = 0x1023,
    // XFEATURE_XTILEDATA = 18); without it the first tile instruction raises SIGILL.
    let ret: i64;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, 18) only changes this process's permitted xstate;
    // the syscall instruction clobbers rcx and r11, declared below.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") 158i64 => ret, in("rdi") 0x1023i64,
            in("rsi") 18i64, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if ret != 0 {
        // Said once (detection is cached): e.g. ENOSPC when a thread's alternate signal stack is
        // too small for the tile state (old CPython faulthandler builds).
        eprintln!(
            "kwker: this CPU has AMX but Linux refused its tile state to this process (arch_prctl              error {}); the amx tier is off, AVX-512 runs instead",
            -ret
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// The tile operations AMX kernels are written with (fixed roles, see the module header).
///
/// # Safety
/// Pointers must address `ROWS` rows of `ROW_BYTES` bytes, `stride` bytes apart, readable (loads)
/// or writable (stores); `configure` must precede every other call and `release` end the run.
pub(crate) trait Tiles {
    /// Configures all eight tiles as `ROWS` x `ROW_BYTES`.
    unsafe fn configure(&mut self);
    /// Returns the tile state to init (cheap context switches for the thread afterwards).
    unsafe fn release(&mut self);
    /// Zeroes the four sum tiles.
    unsafe fn zero_c(&mut self);
    /// Loads activation tile A[i] (i < 2).
    unsafe fn load_a(&mut self, i: usize, p: *const u8, stride: usize);
    /// Loads weight tile B[j] (j < 2).
    unsafe fn load_b(&mut self, j: usize, p: *const u8, stride: usize);
    /// C[2i + j] += A[i] x B[j] in bf16 pairs with float32 sums, for i, j < 2.
    unsafe fn dp_bf16(&mut self);
    /// Stores sum tile C[t] (t < 4).
    unsafe fn store_c(&mut self, t: usize, p: *mut u8, stride: usize);
    /// Loads sum tile C[t] (t < 4), as `store_c` wrote it.
    unsafe fn load_c(&mut self, t: usize, p: *const u8, stride: usize);
}

/// The hardware tiles. Construct only after `usable()` returned true.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Hw;

/// `asm!` of tile instructions that only touch tile registers, with the options all such blocks take.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_ops {
    ($($insn:literal),+) => {
        std::arch::asm!($($insn),+, options(nostack, nomem, preserves_flags))
    };
}

/// A 64-byte `ldtilecfg` operand: palette 1 and the tiles it configures (the others stay unused).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

#[cfg(target_arch = "x86_64")]
impl TileConfig {
    /// Palette 1 with each listed (tile, rows, bytes per row).
    pub(crate) fn new(tiles: &[(usize, usize, usize)]) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        for &(t, rows, colsb) in tiles {
            // colsb: u16 per tile at byte 16; rows: u8 per tile at byte 48.
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + t] = rows as u8;
        }
        TileConfig(c)
    }

    /// `ldtilecfg`: configures the tiles as listed.
    ///
    /// # Safety
    /// AMX is usable in this process (`usable()`), with every tile shape listed supported.
    pub(crate) unsafe fn load(&self) {
        // SAFETY: the caller's contract; self is a valid palette-1 configuration, 64-byte aligned.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(),
                options(nostack, readonly, preserves_flags));
        }
    }
}

/// `tilerelease`: the tile state back to init (cheap context switches for the thread afterwards).
///
/// # Safety
/// AMX is usable in this process (`usable()`).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn release_tiles() {
    // SAFETY: AMX usable (caller's contract); releasing is always valid then.
    unsafe { tile_ops!("tilerelease") }
}

/// `tileloadd tmmN, [p + stride]` for a literal tile number.
#[cfg(target_arch = "x86_64")]
macro_rules! tileload {
    ($t:literal, $p:expr, $s:expr) => {
        std::arch::asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) $p,
            s = in(reg) $s, options(nostack, readonly, preserves_flags))
    };
}

/// `tilestored [p + stride], tmmN` for a literal tile number.
#[cfg(target_arch = "x86_64")]
macro_rules! tilestore {
    ($t:literal, $p:expr, $s:expr) => {
        std::arch::asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) $p,
            s = in(reg) $s, options(nostack, preserves_flags))
    };
}

/// Runs `$op!` (`tileload` or `tilestore`) on the tile that index `$i` names: the literal tile of the
/// arm it matches, the last one for any other index.
#[cfg(target_arch = "x86_64")]
macro_rules! on_tile {
    ($op:ident($p:expr, $s:expr), $i:expr, [$($n:literal => $tmm:literal),*], _ => $last:literal) => {
        match $i {
            $($n => $op!($tmm, $p, $s),)*
            _ => $op!($last, $p, $s),
        }
    };
}

#[cfg(target_arch = "x86_64")]
impl Tiles for Hw {
    unsafe fn configure(&mut self) {
        let all: [(usize, usize, usize); 8] = std::array::from_fn(|t| (t, ROWS, ROW_BYTES));
        // SAFETY: AMX usable (constructor's contract); every tile ROWS x ROW_BYTES (checked by usable()).
        unsafe { TileConfig::new(&all).load() }
    }
    unsafe fn release(&mut self) {
        // SAFETY: AMX usable (constructor's contract).
        unsafe { release_tiles() }
    }
    unsafe fn zero_c(&mut self) {
        // SAFETY: tiles configured (trait contract).
        unsafe {
            tile_ops!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3"
            )
        }
    }
    unsafe fn load_a(&mut self, i: usize, p: *const u8, stride: usize) {
        // SAFETY: tiles configured; p addresses ROWS rows of ROW_BYTES (trait contract).
        unsafe { on_tile!(tileload(p, stride), i, [0 => "4"], _ => "5") }
    }
    unsafe fn load_b(&mut self, j: usize, p: *const u8, stride: usize) {
        // SAFETY: as load_a.
        unsafe { on_tile!(tileload(p, stride), j, [0 => "6"], _ => "7") }
    }
    unsafe fn dp_bf16(&mut self) {
        // SAFETY: tiles configured and loaded; AMX-BF16 checked by usable().
        unsafe {
            tile_ops!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7"
            )
        }
    }
    unsafe fn store_c(&mut self, t: usize, p: *mut u8, stride: usize) {
        // SAFETY: tiles configured; p addresses ROWS writable rows of ROW_BYTES (trait contract).
        unsafe { on_tile!(tilestore(p, stride), t, [0 => "0", 1 => "1", 2 => "2"], _ => "3") }
    }
    unsafe fn load_c(&mut self, t: usize, p: *const u8, stride: usize) {
        // SAFETY: tiles configured; p addresses ROWS rows of ROW_BYTES (trait contract).
        unsafe { on_tile!(tileload(p, stride), t, [0 => "0", 1 => "1", 2 => "2"], _ => "3") }
    }
}
