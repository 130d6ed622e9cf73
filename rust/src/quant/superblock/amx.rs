//! The AMX tier of the super-block path (prompts of q4k / q6k matrices). From `min_rows` rows (unpacked
//! codes) one tile call takes every row left, 16 at a time: per sub-block, one `tdpbsud` per panel turns
//! 16 rows of activation codes and the panel's unpacked codes (`amx::int8`'s B tile is exactly one
//! sub-block of `CODES_BYTES`) into the 16 x 16 exact sums the VNNI tiers build from 8 `vpdpbusd`, and the
//! contract's float epilogue adds them into y (AVX-512, or scalar where the CPU has no AVX-512: the
//! emulated tiles in tests). Decode steps (packed codes) run the AVX-512 VNNI tiles.
//! Contract: `superblock.rs`'s, bit for bit (the sums are exact integers; the epilogue is the scalar
//! tier's operations in its order).
//!
//! Timed on a Sapphire Rapids-class Xeon VM (2026-12-05, benchmarks/HISTORY.md): even with the AVX-512 VNNI tiles
//! from 32 rows, whole prompts included. With one activation scale per 32 values each product spans one
//! sub-block and the float epilogue (the same work per output as the VNNI tiles') bounds both.

use std::cell::Cell;

use super::{codes_ref, generic, header_ref, Kernels, Tile};
use crate::amx::int8::{Emu, IntTiles, A_BYTES};
use crate::quant::kblock::{SUBS, SUPER};
use crate::quant::{Format, QPANEL};

/// The hardware tier: AVX-512 unpacking, decode tiles and epilogue around the AMX products.
#[cfg(target_arch = "x86_64")]
pub(crate) static KERNELS: Kernels = Kernels {
    header: super::x86::header,
    codes: super::x86::codes,
    tile: tile_hw,
    min_rows: 24,
    panels: 2,
    tiled: true,
};

/// Rows from which a tile of unpacked codes runs on AMX; fewer run the AVX-512 VNNI tiles, as do the
/// packed ones. Timed on a Sapphire Rapids-class Xeon (`examples/quant_hot`, 1536 x 576, one thread):
/// 16 rows on tiles took twice the VNNI tiles' time (the tile configuration and the per-sub-block
/// epilogue are the cost at K = 32), from 32 rows the two are even within the VM's noise.
#[cfg(target_arch = "x86_64")]
const HW_MIN_ROWS: usize = 32;

/// The same path over the emulated tiles, with the reference unpacking and the scalar epilogue: runs on
/// any CPU (tests).
pub(crate) static EMULATED: Kernels = Kernels {
    header: header_ref,
    codes: codes_ref,
    tile: tile_emulated,
    min_rows: 16,
    panels: 2,
    tiled: false,
};

/// The emulated tiles with the hardware tier's AVX-512 epilogue (tests, on AVX-512 CPUs).
#[cfg(target_arch = "x86_64")]
pub(crate) static EMULATED_AVX512: Kernels = Kernels {
    tile: tile_emulated_avx512,
    ..EMULATED
};

thread_local! {
    /// `tdpbsud` products this thread ran (real or emulated): tests prove the AMX path ran.
    static PRODUCTS: Cell<usize> = const { Cell::new(0) };
}

/// Tile products (one sub-block x 16 rows x one panel) the calling thread has run on this path.
pub(crate) fn products_run() -> usize {
    PRODUCTS.with(Cell::get)
}

/// # Safety
/// The CPU has AMX-INT8 with the tile state granted (`amx::int8::usable`) and AVX-512 VNNI; `t` is what
/// the driver gives a tile.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_hw(t: &Tile<'_>) -> usize {
    if t.packed || t.left() < HW_MIN_ROWS {
        return super::avx512::tile(t);
    }
    let mut hw = crate::amx::int8::Hw;
    rows(&mut hw, t, epilogue_avx512)
}

/// # Safety
/// `t` is what the driver gives a tile.
unsafe fn tile_emulated(t: &Tile<'_>) -> usize {
    if t.packed {
        return generic::tile(t);
    }
    rows(&mut Emu::new(), t, epilogue_scalar)
}

/// # Safety
/// The CPU has AVX-512 F/BW/VL/DQ; `t` is what the driver gives a tile.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_emulated_avx512(t: &Tile<'_>) -> usize {
    if t.packed {
        return generic::tile(t);
    }
    rows(&mut Emu::new(), t, epilogue_avx512)
}

/// Sums of one super-block's products for 16 rows: `[s][j]` is sub-block s against panel j, 16 rows x 16
/// outputs.
type Sums = [[[i32; 256]; 2]; SUBS];

/// Adds rows r0..r0 + n's sums of sub-blocks 0..tt of super-block b (`sums[s][j]`) into their y, for the
/// tile's panels: each y read once and written once per super-block, its sub-blocks added in order.
type Epilogue = unsafe fn(&Tile<'_>, usize, usize, usize, usize, &Sums);

/// Every row left of the tile against its panels, over its super-blocks (unpacked codes: one). All of a
/// super-block's products for 16 rows run before their epilogue, so each y stays in a register across the
/// sub-blocks (the tiles are not the cost at K = 32: the float epilogue and y's traffic are, measured).
///
/// # Safety
/// `tiles` runs on this CPU; `t` has unpacked codes and headers for `t.panels` (<= 2) panels.
unsafe fn rows<T: IntTiles>(tiles: &mut T, t: &Tile<'_>, epilogue: Epilogue) -> usize {
    let left = t.left();
    let k = t.job.w.k();
    let mut sums: Box<Sums> = SUMS
        .with(|c| c.take())
        .unwrap_or_else(|| Box::new([[[0; 256]; 2]; SUBS]));
    // A short last chunk reads its rows' codes from here, zero below them (no read past the activations).
    let mut pad = [0i8; 16 * SUPER];
    tiles.configure();
    for b in t.blocks.clone() {
        let tt = t.lay.subs(b);
        for r0 in (0..left).step_by(16) {
            let n = (left - r0).min(16);
            let (a, stride) = if n == 16 {
                (t.x(r0, b).cast::<u8>(), k)
            } else {
                pad.fill(0);
                for r in 0..n {
                    std::ptr::copy_nonoverlapping(
                        t.x(r0 + r, b),
                        pad[r * SUPER..].as_mut_ptr(),
                        tt * A_BYTES,
                    );
                }
                (pad.as_ptr().cast::<u8>(), SUPER)
            };
            for (s, ss) in sums.iter_mut().enumerate().take(tt) {
                tiles.zero_c();
                tiles.load_a(a.add(s * A_BYTES), stride);
                for (j, sj) in ss.iter_mut().enumerate().take(t.panels) {
                    tiles.load_b(j, t.src.add(j * t.stride + s * 512));
                    tiles.dp(j);
                    tiles.store_c(j, sj.as_mut_ptr());
                }
            }
            PRODUCTS.with(|c| c.set(c.get() + t.panels * tt));
            epilogue(t, b, tt, r0, n, &sums);
        }
    }
    tiles.release();
    SUMS.with(|c| c.set(Some(sums)));
    left
}

thread_local! {
    /// Each thread's `Sums` (16 KB), kept between tiles rather than on the stack of every call.
    static SUMS: Cell<Option<Box<Sums>>> = const { Cell::new(None) };
}

/// The contract's epilogue, one output at a time (the scalar tier's operations).
unsafe fn epilogue_scalar(t: &Tile<'_>, b: usize, tt: usize, r0: usize, n: usize, sums: &Sums) {
    let q6 = t.job.w.format == Format::Q6K;
    for j in 0..t.panels {
        let h = &*t.hdr.add(j);
        for r in 0..n {
            let y =
                std::slice::from_raw_parts_mut(t.y.add((r0 + r) * t.ystride + QPANEL * j), QPANEL);
            for (s, ss) in sums.iter().enumerate().take(tt) {
                let (dx, sx) = t.scale_sum(r0 + r, b, s);
                for (c, yc) in y.iter_mut().enumerate() {
                    let dot = ss[j][16 * r + c] as f32;
                    let (ds, dm) = (h.ds[s][c], h.dm[s][c]);
                    *yc = if q6 {
                        ds.mul_add((dot - 32.0 * sx) * dx, *yc)
                    } else {
                        ds.mul_add(dot, -(dm * sx)).mul_add(dx, *yc)
                    };
                }
            }
        }
    }
}

/// `epilogue_scalar` on 16 outputs per instruction (the AVX-512 tiles' operations, the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn epilogue_avx512(t: &Tile<'_>, b: usize, tt: usize, r0: usize, n: usize, sums: &Sums) {
    use std::arch::x86_64::*;
    let q6 = t.job.w.format == Format::Q6K;
    for j in 0..t.panels {
        let h = &*t.hdr.add(j);
        for r in 0..n {
            let yp = t.y.add((r0 + r) * t.ystride + QPANEL * j);
            let mut y = _mm512_loadu_ps(yp);
            for (s, ss) in sums.iter().enumerate().take(tt) {
                let (dx, sx) = t.scale_sum(r0 + r, b, s);
                let (ds, dm) = (
                    _mm512_load_ps(h.ds[s].as_ptr()),
                    _mm512_load_ps(h.dm[s].as_ptr()),
                );
                let dot = _mm512_cvtepi32_ps(_mm512_loadu_si512(ss[j][16 * r..].as_ptr().cast()));
                y = if q6 {
                    let c = _mm512_sub_ps(dot, _mm512_set1_ps(32.0 * sx));
                    _mm512_fmadd_ps(ds, _mm512_mul_ps(c, _mm512_set1_ps(dx)), y)
                } else {
                    let v = _mm512_fmsub_ps(ds, dot, _mm512_mul_ps(dm, _mm512_set1_ps(sx)));
                    _mm512_fmadd_ps(v, _mm512_set1_ps(dx), y)
                };
            }
            _mm512_storeu_ps(yp, y);
        }
    }
}
