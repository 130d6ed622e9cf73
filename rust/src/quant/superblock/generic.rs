//! The scalar tier of the super-block path, and the reference every SIMD tier matches bit for bit: the
//! module's contract (`superblock.rs`) written out one output at a time, over the reference unpacking
//! (`header_ref`, `codes_ref`), reading packed codes with `kblock::code` or the unpacked bytes.

use super::{codes_ref, header_ref, Kernels, Tile};
use crate::quant::kblock::{code, heads, sub_ints, SUBS};
use crate::quant::{acts, Format, QPANEL, QSUB};

pub(crate) static KERNELS: Kernels = Kernels {
    quantize: acts::quantize_super_rows,
    header: header_ref,
    codes: codes_ref,
    tile,
    min_rows: 6,
    panels: 1,
};

/// Every row left against one panel.
///
/// # Safety
/// `t` is what the `superblock` driver gives a tile.
pub(crate) unsafe fn tile(t: &Tile<'_>) -> usize {
    let f = t.job.w.format;
    // The header exists only beside unpacked codes.
    let hd = (!t.packed).then(|| &*t.hdr);
    let len = if t.packed {
        super::super_bytes(f, t.t)
    } else {
        super::CODES_BYTES
    };
    let blk = std::slice::from_raw_parts(t.src, len);
    let c = |s: usize, j: usize, kk: usize| -> i32 {
        if t.packed {
            code(f, blk, t.t, s, j, kk) as i32
        } else {
            blk[s * 512 + (kk / 4) * 64 + 4 * j + kk % 4] as i32
        }
    };
    for r in 0..t.left() {
        let x = std::slice::from_raw_parts(t.x(r), t.t * QSUB);
        let (dx, bsums) = t.scale_sums(r);
        let bsums = std::slice::from_raw_parts(bsums, SUBS);
        let y = std::slice::from_raw_parts_mut(t.y.add(r * t.ystride), QPANEL);
        for (j, yj) in y.iter_mut().enumerate() {
            let (mut a, mut bm) = (0i32, 0i32);
            for s in 0..t.t {
                let dot: i32 = (0..QSUB)
                    .map(|kk| c(s, j, kk) * x[s * QSUB + kk] as i32)
                    .sum();
                // The sub-block's scale and B's weight (Q4K's min, Q6K's scale): from the packed bytes,
                // or from the header (its half of pair s / 2).
                let (sc, m) = if t.packed {
                    let (sc, mc) = sub_ints(f, blk, t.t, s, j);
                    (sc, if f == Format::Q4K { mc } else { sc })
                } else {
                    let hd = hd.unwrap();
                    (
                        hd.sc[s][j],
                        (hd.pairs[s / 2][j] >> (16 * (s % 2))) as i16 as i32,
                    )
                };
                a += sc * dot;
                bm += m * bsums[s] as i32;
            }
            let (d, dmin) = if t.packed {
                heads(f, blk, j)
            } else {
                let hd = hd.unwrap();
                (hd.d[j], hd.dmin[j])
            };
            *yj = match f {
                Format::Q4K => dx.mul_add(d.mul_add(a as f32, -(dmin * bm as f32)), *yj),
                _ => dx.mul_add(d * (a - 32 * bm) as f32, *yj),
            };
        }
    }
    t.left()
}
