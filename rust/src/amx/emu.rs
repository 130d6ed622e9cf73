//! The AMX tiles emulated in memory, with the SDM's semantics: `tdpbf16ps` sums bf16 products in
//! float32, the even product of a pair first, pair after pair; denormal inputs read as zero (DAZ),
//! denormal results flushed (FTZ). Kernels generic over `Tiles` run on it on any CPU (tests).

use super::{Tiles, ROWS, ROW_BYTES};

/// The tiles in memory, with the instructions' semantics: for tests on any CPU.
pub(crate) struct Emu {
    tiles: Box<[[u8; ROWS * ROW_BYTES]; 8]>,
    configured: bool,
}

impl Emu {
    pub(crate) fn new() -> Emu {
        Emu {
            tiles: Box::new([[0; ROWS * ROW_BYTES]; 8]),
            configured: false,
        }
    }

    fn f32_at(&self, t: usize, row: usize, col: usize) -> f32 {
        let o = row * ROW_BYTES + 4 * col;
        f32::from_le_bytes(self.tiles[t][o..o + 4].try_into().unwrap())
    }

    fn bf16_at(&self, t: usize, row: usize, col: usize) -> f32 {
        let o = row * ROW_BYTES + 2 * col;
        let b = u16::from_le_bytes([self.tiles[t][o], self.tiles[t][o + 1]]);
        // Denormal inputs read as zero (DAZ), as the instruction does.
        let b = if b & 0x7f80 == 0 { b & 0x8000 } else { b };
        f32::from_bits((b as u32) << 16)
    }

    fn load(&mut self, t: usize, p: *const u8, stride: usize) {
        assert!(self.configured, "AMX emulation: tile load before configure");
        for r in 0..ROWS {
            // SAFETY: the trait contract: p + r * stride addresses ROW_BYTES readable bytes.
            let row = unsafe { std::slice::from_raw_parts(p.add(r * stride), ROW_BYTES) };
            self.tiles[t][r * ROW_BYTES..(r + 1) * ROW_BYTES].copy_from_slice(row);
        }
    }
}

/// Flushes a denormal float32 to zero of the same sign (FTZ), as the tile instructions do.
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

impl Tiles for Emu {
    unsafe fn configure(&mut self) {
        self.configured = true;
        self.tiles.iter_mut().for_each(|t| t.fill(0));
    }
    unsafe fn release(&mut self) {
        self.configured = false;
    }
    unsafe fn zero_c(&mut self) {
        assert!(self.configured, "AMX emulation: tilezero before configure");
        self.tiles[..4].iter_mut().for_each(|t| t.fill(0));
    }
    unsafe fn load_a(&mut self, i: usize, p: *const u8, stride: usize) {
        self.load(4 + i, p, stride);
    }
    unsafe fn load_b(&mut self, j: usize, p: *const u8, stride: usize) {
        self.load(6 + j, p, stride);
    }
    unsafe fn dp_bf16(&mut self) {
        assert!(self.configured, "AMX emulation: tdpbf16ps before configure");
        for (c, a, b) in [(0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)] {
            for m in 0..ROWS {
                for n in 0..ROW_BYTES / 4 {
                    let mut acc = self.f32_at(c, m, n);
                    for pair in 0..ROW_BYTES / 4 {
                        // Fused, as the SDM writes it (bf16 products are exact in float32 but for
                        // underflow and overflow, where the fused form is the one that counts).
                        let (ae, be) = (self.bf16_at(a, m, 2 * pair), self.bf16_at(b, pair, 2 * n));
                        let (ao, bo) = (
                            self.bf16_at(a, m, 2 * pair + 1),
                            self.bf16_at(b, pair, 2 * n + 1),
                        );
                        acc = ftz(ao.mul_add(bo, ftz(ae.mul_add(be, acc))));
                    }
                    let o = m * ROW_BYTES + 4 * n;
                    self.tiles[c][o..o + 4].copy_from_slice(&acc.to_le_bytes());
                }
            }
        }
    }
    unsafe fn load_c(&mut self, t: usize, p: *const u8, stride: usize) {
        self.load(t, p, stride);
    }
    unsafe fn store_c(&mut self, t: usize, p: *mut u8, stride: usize) {
        assert!(
            self.configured,
            "AMX emulation: tile store before configure"
        );
        for r in 0..ROWS {
            // SAFETY: the trait contract: p + r * stride addresses ROW_BYTES writable bytes.
            let row = unsafe { std::slice::from_raw_parts_mut(p.add(r * stride), ROW_BYTES) };
            row.copy_from_slice(&self.tiles[t][r * ROW_BYTES..(r + 1) * ROW_BYTES]);
        }
    }
}

mod tests {
    use super::*;
    use crate::amx::Tiles;

    /// The emulated tdpbf16ps against the definition written out, on one tile quadruple.
    #[test]
    fn emulated_dp_matches_definition() {
        let mut rng = 0x2545_f491_u32;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            // bf16 of a value in [-2, 2)
            let v = (rng as f32 / u32::MAX as f32) * 4.0 - 2.0;
            (v.to_bits() >> 16) as u16
        };
        let a: Vec<u16> = (0..2 * 16 * 32).map(|_| next()).collect();
        let b: Vec<u16> = (0..2 * 16 * 32).map(|_| next()).collect();
        let mut e = Emu::new();
        let mut c = vec![0f32; 4 * 256];
        // SAFETY: every pointer addresses 16 rows of 64 bytes inside its Vec.
        unsafe {
            e.configure();
            e.zero_c();
            e.load_a(0, a.as_ptr().cast(), 64);
            e.load_a(1, a[512..].as_ptr().cast(), 64);
            e.load_b(0, b.as_ptr().cast(), 64);
            e.load_b(1, b[512..].as_ptr().cast(), 64);
            e.dp_bf16();
            e.dp_bf16();
            for t in 0..4 {
                e.store_c(t, c[t * 256..].as_mut_ptr().cast(), 64);
            }
            e.release();
        }
        let f = |v: u16| f32::from_bits((v as u32) << 16) as f64;
        for (t, (i, j)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
            for m in 0..16 {
                for n in 0..16 {
                    let mut want = 0f64;
                    for kk in 0..32 {
                        // A[i] row m holds k = kk; B[j] row kk / 2 holds column n's pair.
                        want += f(a[i * 512 + m * 32 + kk])
                            * f(b[j * 512 + (kk / 2) * 32 + 2 * n + kk % 2]);
                    }
                    let got = c[t * 256 + m * 16 + n] as f64;
                    assert!(
                        (got - 2.0 * want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{t} {m} {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn emulated_inputs_denormal_read_as_zero() {
        let mut e = Emu::new();
        let mut a = vec![0u16; 512];
        let mut b = vec![0u16; 512];
        a[0] = 0x0001; // the smallest bf16 denormal
        b[0] = 0x7f00; // 2^127: the exact product would be a normal float32
        let mut c = vec![0f32; 256];
        // SAFETY: 16 rows of 64 bytes in each buffer.
        unsafe {
            e.configure();
            e.zero_c();
            e.load_a(0, a.as_ptr().cast(), 64);
            e.load_a(1, a.as_ptr().cast(), 64);
            e.load_b(0, b.as_ptr().cast(), 64);
            e.load_b(1, b.as_ptr().cast(), 64);
            e.dp_bf16();
            e.store_c(0, c.as_mut_ptr().cast(), 64);
        }
        assert_eq!(c[0], 0.0);
    }
}
