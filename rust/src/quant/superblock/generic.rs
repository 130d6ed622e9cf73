//! The scalar tier of the super-block path, and the reference every SIMD tier matches bit for bit: the
//! module's contract (`superblock.rs`) written out one output at a time, over the reference unpacking
//! (`header_ref`, `codes_ref`), reading packed bytes with `kblock`'s accessors or the unpacked ones.

use super::{codes_ref, header_ref, Kernels, Tile};
use crate::quant::kblock::{code, sub_scales};
use crate::quant::{Format, QPANEL, QSUB};

pub(crate) static KERNELS: Kernels = Kernels {
    header: header_ref,
    codes: codes_ref,
    tile,
    min_rows: 6,
    panels: 1,
    tiled: false,
};

/// Every row left against one panel.
///
/// # Safety
/// `t` is what the `superblock` driver gives a tile.
pub(crate) unsafe fn tile(t: &Tile<'_>) -> usize {
    let f = t.job.w.format;
    // The header exists only beside unpacked codes.
    let hd = (!t.packed).then(|| &*t.hdr);
    for b in t.blocks.clone() {
        let tt = t.lay.subs(b);
        let len = if t.packed {
            super::super_bytes(f, tt)
        } else {
            super::CODES_BYTES
        };
        let blk = std::slice::from_raw_parts(t.block(b), len);
        for r in 0..t.left() {
            let x = std::slice::from_raw_parts(t.x(r, b), tt * QSUB);
            let y = std::slice::from_raw_parts_mut(t.y.add(r * t.ystride), QPANEL);
            for s in 0..tt {
                let (dx, sx) = t.scale_sum(r, b, s);
                for (j, yj) in y.iter_mut().enumerate() {
                    let c = |kk: usize| -> i32 {
                        if t.packed {
                            code(f, blk, tt, s, j, kk) as i32
                        } else {
                            blk[s * 512 + (kk / 4) * 64 + 4 * j + kk % 4] as i32
                        }
                    };
                    let dot_of = |ks: std::ops::Range<usize>| {
                        ks.map(|kk| c(kk) * x[s * QSUB + kk] as i32).sum::<i32>() as f32
                    };
                    let (ds, dm) = match hd {
                        Some(h) => (h.ds[s][j], h.dm[s][j]),
                        None => sub_scales(f, blk, tt, s, j),
                    };
                    *yj = match f {
                        // Q4, Q40, Q50 (their 32-value blocks as sub-blocks) in Q4K's form.
                        Format::Q4K | Format::Q4 | Format::Q40 | Format::Q50 => {
                            ds.mul_add(dot_of(0..QSUB), -(dm * sx)).mul_add(dx, *yj)
                        }
                        Format::Q6K16 => {
                            let sa = t.half_sum(r, b, s);
                            let (da, db) = (dot_of(0..QSUB / 2), dot_of(QSUB / 2..QSUB));
                            let y = ds.mul_add((da - 32.0 * sa) * dx, *yj);
                            dm.mul_add((db - 32.0 * (sx - sa)) * dx, y)
                        }
                        _ => ds.mul_add((dot_of(0..QSUB) - 32.0 * sx) * dx, *yj),
                    };
                }
            }
        }
    }
    t.left()
}
