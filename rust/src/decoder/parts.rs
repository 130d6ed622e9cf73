//! A matrix stored as runs of rows in different quantized formats (`Mat::Parts`): a GGUF file's fused
//! projection whose parts come in types no one format holds exactly (a Q4_K_M file's q/k in Q4_K beside v in
//! Q6_K), so each run keeps the file's bits instead of being quantized again into the widest format.
//!
//! Numerical contract: each run's output columns are `quant_linear` of that run alone (its own activation
//! codes, its bias slice), bit for bit; the runs only place them side by side.
//!
//! Saved form (`to_bytes` / `from_bytes`, a saved decoder's "parts" tensors): the magic `KWKPARTS`, a u32
//! count, then per run its format name's length (u8) and name, its rows and its byte length (u64 each), and
//! its packed bytes (`QuantWeight::packed_bytes`); all little-endian.

use crate::isa::Isa;
use crate::par::Parallel;
use crate::quant::{quant_linear, Format, QuantWeight, QPANEL};
use crate::scratch::with_scratch;

const MAGIC: &[u8; 8] = b"KWKPARTS";

/// Checks runs for a `Mat::Parts`: at least two, the same cols, every run but the last a whole number of
/// 16-row panels (so no panel mixes formats).
pub fn check(parts: &[QuantWeight]) -> Result<(), String> {
    if parts.len() < 2 {
        return Err(format!(
            "a matrix of parts needs at least two, got {}",
            parts.len()
        ));
    }
    let k = parts[0].k();
    for (i, q) in parts.iter().enumerate() {
        if q.k() != k {
            return Err(format!("part {i} has {} columns, part 0 has {k}", q.k()));
        }
        if i + 1 < parts.len() && !q.n().is_multiple_of(QPANEL) {
            return Err(format!(
                "part {i} has {} rows, not a multiple of {QPANEL}",
                q.n()
            ));
        }
    }
    Ok(())
}

/// y[..m * n] = x[..m * k] w^T (+ b) for runs of rows `parts` (n their rows in all): each run's columns by
/// `quant_linear` into a buffer of its own, then placed in y.
pub fn parts_linear(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    parts: &[QuantWeight],
    b: Option<&[f32]>,
    y: &mut [f32],
) {
    let n: usize = parts.iter().map(QuantWeight::n).sum();
    let widest = parts.iter().map(QuantWeight::n).max().unwrap_or(0);
    // One run's columns at a time, in this thread's reused scratch (`quant_linear` writes all of it).
    with_scratch(m * widest, |scratch| {
        let mut c0 = 0;
        for q in parts {
            let nj = q.n();
            let buf = &mut scratch[..m * nj];
            quant_linear(isa, par, x, m, q, b.map(|b| &b[c0..c0 + nj]), buf);
            for (i, row) in buf.chunks_exact(nj).enumerate() {
                y[i * n + c0..i * n + c0 + nj].copy_from_slice(row);
            }
            c0 += nj;
        }
    });
}

/// The saved form of `parts` (module header).
pub fn to_bytes(parts: &[QuantWeight]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for q in parts {
        let name = q.format.name().as_bytes();
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&(q.n() as u64).to_le_bytes());
        out.extend_from_slice(&(q.packed_bytes().len() as u64).to_le_bytes());
        out.extend_from_slice(q.packed_bytes());
    }
    out
}

/// Runs of a [rows, cols] matrix back from `to_bytes`'s form (every length and scale checked).
pub fn from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Vec<QuantWeight>, String> {
    let bad = |why: &str| format!("a [{rows}, {cols}] matrix of parts: {why}");
    let mut at = 0usize;
    let mut take = |len: usize| -> Result<&[u8], String> {
        let s = bytes
            .get(at..at.saturating_add(len))
            .ok_or_else(|| bad("its bytes end early"))?;
        at += len;
        Ok(s)
    };
    if take(8)? != MAGIC {
        return Err(bad("it does not start with KWKPARTS"));
    }
    let u64_at = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap()) as usize;
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
    let mut parts = Vec::new();
    for _ in 0..count.min(rows) {
        let len = take(1)?[0] as usize;
        let name = String::from_utf8_lossy(take(len)?).into_owned();
        let f = Format::from_name(&name).ok_or_else(|| bad(&format!("unknown format {name:?}")))?;
        let n = u64_at(take(8)?);
        let len = u64_at(take(8)?);
        parts.push(QuantWeight::from_packed(f, n, cols, take(len)?.to_vec()).map_err(|e| bad(&e))?);
    }
    if at != bytes.len() {
        return Err(bad("bytes are left after its parts"));
    }
    check(&parts).map_err(|e| bad(&e))?;
    let n: usize = parts.iter().map(QuantWeight::n).sum();
    if n != rows {
        return Err(bad(&format!("its parts have {n} rows")));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::SpinPool;
    use crate::quant::{quantize, QuantOptions};

    fn weight(format: Format, n: usize, k: usize, seed: u32) -> QuantWeight {
        let v: Vec<f32> = (0..n * k)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let opt = QuantOptions {
            format,
            importance: None,
            threads: 1,
        };
        QuantWeight::pack(&quantize(&v, n, k, &opt).unwrap())
    }

    /// Each run's columns are that run's `quant_linear` alone, bit for bit (with its bias slice), and the
    /// saved form gives the same runs back.
    #[test]
    fn runs_side_by_side_and_round_trip() {
        let (k, m) = (512, 5);
        let parts = vec![
            weight(Format::Q4K, 48, k, 1),
            weight(Format::Q6K16, 32, k, 2),
            weight(Format::Q80, 20, k, 3),
        ];
        check(&parts).unwrap();
        let n = 100;
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let b: Vec<f32> = (0..n).map(|j| j as f32 / 10.0).collect();
        let pool = SpinPool::new(2);
        let isa = crate::isa::detect();
        let mut y = vec![0.0f32; m * n];
        parts_linear(isa, &pool, &x, m, &parts, Some(&b), &mut y);
        let mut c0 = 0;
        for q in &parts {
            let mut alone = vec![0.0f32; m * q.n()];
            quant_linear(isa, &pool, &x, m, q, Some(&b[c0..c0 + q.n()]), &mut alone);
            for i in 0..m {
                assert_eq!(
                    y[i * n + c0..i * n + c0 + q.n()],
                    alone[i * q.n()..(i + 1) * q.n()],
                    "{:?} row {i}",
                    q.format
                );
            }
            c0 += q.n();
        }
        let back = from_bytes(n, k, &to_bytes(&parts)).unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in back.iter().zip(&parts) {
            assert_eq!(
                (a.format, a.n(), a.packed_bytes()),
                (b.format, b.n(), b.packed_bytes())
            );
        }
    }

    #[test]
    fn damaged_forms_are_refused_by_name() {
        let k = 256;
        let parts = vec![
            weight(Format::Q4K, 16, k, 1),
            weight(Format::Q6K16, 16, k, 2),
        ];
        let bytes = to_bytes(&parts);
        let err = from_bytes(32, k, &bytes[..bytes.len() - 1]).unwrap_err();
        assert!(err.contains("its bytes end early"), "{err}");
        let err = from_bytes(48, k, &bytes).unwrap_err();
        assert!(err.contains("its parts have 32 rows"), "{err}");
        let err = from_bytes(32, k, b"KWKPARTX\0\0\0\0").unwrap_err();
        assert!(err.contains("does not start with KWKPARTS"), "{err}");
        let err = check(&[
            weight(Format::Q4K, 20, k, 1),
            weight(Format::Q6K16, 16, k, 2),
        ])
        .unwrap_err();
        assert!(
            err.contains("part 0 has 20 rows, not a multiple of 16"),
            "{err}"
        );
    }
}
