//! One attention task: a block of query heads (sharing one kv head) times a block of query
//! tokens, for one batch element and one range of keys. ISA-independent; the per-ISA
//! primitives come in `Ops`.
//!
//! Keys are processed in chunks of KEY_CHUNK rows: a bf16 chunk is widened once into an
//! L1-sized f32 buffer and then reused by every query row (f32 caches are read in place); the
//! kernels share each K/V load among several rows (a prompt's tokens, a token's heads), with each
//! row's arithmetic that of a one-row call, so a row's output does not depend on the rows beside it.
//! Rows are ordered token-major (row = token * heads + head), so the rows that may see a key
//! always form a suffix of the block; with a sliding window each row sees a contiguous range of keys
//! whose both ends grow with the row, and the task's key range starts where its first row's does. A task covering all keys writes final rows; a task
//! covering one key range writes unnormalised partials that `merge` combines.
//! Numerical contract: as in `attention` (f32 everywhere, one conversion to E at the end;
//! for bf16 V the softmax numerators are rounded to bf16 before P·V, as torch does).

use std::ops::Range;

use super::kv_view::{kv_rows_f32, rows_f32, KvView};
use super::scores_q8::{self, QRows, MAX_INT_D};
use super::values_q8::{self, PvQ8Args};
use super::{AttnParams, Ops, PvArgs, QkArgs, View4, MAX_ROWS};
use crate::bf16::{bf16_to_f32, classify, f32_to_bf16, Element};
use crate::par::SyncPtr;
use crate::quant::row_q8;
use crate::scratch::with_scratch;

/// Keys per chunk: 64 keys x 128 dims x 4 bytes = 32 KB, inside L1.
pub(crate) const KEY_CHUNK: usize = 64;

pub(crate) struct Block {
    pub b: usize,
    pub kv_head: usize,
    /// Absolute query-head indices, all mapping to `kv_head`.
    pub heads: Range<usize>,
    pub tokens: Range<usize>,
    /// Key range of this task (clipped to the keys the block can see).
    pub keys: Range<usize>,
}

/// Where a task's rows go.
pub(crate) enum Sink<E> {
    /// Normalised rows, converted to E, into the contiguous [B, Hq, T, D] output.
    Out(SyncPtr<E>),
    /// Unnormalised rows `[max, sum, acc[..d]]` (d + 2 floats each, task row order).
    Partial(SyncPtr<f32>),
}

/// Offset of (b, h, t, 0) in the contiguous output.
fn out_offset(dims: &[usize; 4], b: usize, h: usize, t: usize) -> usize {
    ((b * dims[1] + h) * dims[2] + t) * dims[3]
}

/// Computes the rows of `job` over its key range and writes them to `sink`.
///
/// # Safety
/// `ops` must belong to an ISA the CPU supports; the views must have passed
/// `decode_attention`'s validation (in-bounds, T <= S, matching dims, D > 0). `Sink::Out`
/// must point at the contiguous [B, Hq, T, D] output, `Sink::Partial` at heads*tokens*(D+2)
/// floats, and no other thread may access the rows this job writes.
pub(crate) unsafe fn attend<E: Element>(
    ops: &Ops,
    q: &View4<'_, E>,
    k: &KvView<'_, E>,
    v: &KvView<'_, E>,
    params: &AttnParams,
    sink: Sink<E>,
    job: &Block,
) {
    let d = q.dims[3];
    let nh = job.heads.len();
    let rows = nh * job.tokens.len();
    let scale = params.scale;
    // Query t sees keys lo(t)..=base + t, lo(t) = 0 without a window.
    let base = k.dims()[2] - q.dims[2];
    let window = params.window.unwrap_or(usize::MAX);
    let lo = |t: usize| (base + t + 1).saturating_sub(window);
    let ks = job.keys.start.max(lo(job.tokens.start));
    let ke = job.keys.end.min(base + job.tokens.end);
    let nkeys = ke.saturating_sub(ks);
    // Keys of this task row r sees, relative to ks: from..to (empty when it sees none).
    let seen = |r: usize| {
        let t = job.tokens.start + r / nh;
        let to = (base + t + 1).min(ke).saturating_sub(ks);
        (lo(t).saturating_sub(ks).min(to), to)
    };
    let first_row = |s: usize| s.saturating_sub(base + job.tokens.start) * nh;

    let qd = classify(q.data);
    // The torch op's bf16 attention rounds the numerators (below); a bf16 cache under f32 queries does not.
    let round_p = v.is_bf16_elem();
    // An 8-bit cache's keys score against the queries' own int8 codes (`scores_q8`).
    let int_keys = match k {
        KvView::Q8 { codes, scales } if d <= MAX_INT_D => Some((codes, scales)),
        _ => None,
    };
    // And its values weight the numerators' 15-bit codes (`values_q8`).
    let int_values = match v {
        KvView::Q8 { codes, scales } if d <= values_q8::MAX_D => Some((codes, scales)),
        _ => None,
    };
    assert!(
        rows <= MAX_ROWS,
        "attention: {rows} rows exceed a task's {MAX_ROWS}"
    );
    // The first chunk's keys and values on their way while the queries are prepared; each loop below
    // then asks for its next chunk while it computes on this one.
    k.prefetch(job.b, job.kv_head, ks, KEY_CHUNK.min(nkeys));
    v.prefetch(job.b, job.kv_head, ks, KEY_CHUNK.min(nkeys));
    let len = 2 * rows * d + rows * nkeys + KEY_CHUNK * d + 2 * rows + rows * (d.div_ceil(4) + 1);
    with_scratch(len, |buf| {
        let (qcodes, rest) = buf.split_at_mut(rows * d.div_ceil(4));
        // SAFETY: rows * d bytes inside the rows * ceil(d / 4) floats just split off, which nothing
        // else borrows; i8 has no alignment or validity requirement.
        let qcodes = std::slice::from_raw_parts_mut(qcodes.as_mut_ptr().cast::<i8>(), rows * d);
        let (qscales, rest) = rest.split_at_mut(rows);
        let (qbuf, rest) = rest.split_at_mut(rows * d);
        let (acc, rest) = rest.split_at_mut(rows * d);
        let (scores, rest) = rest.split_at_mut(rows * nkeys);
        let (chunk, stats) = rest.split_at_mut(KEY_CHUNK * d);

        // Pre-scaled f32 queries.
        for (tt, t) in job.tokens.clone().enumerate() {
            for (hh, h) in job.heads.clone().enumerate() {
                let (src, _) = rows_f32(ops, &qd, q, job.b, h, t, 1, chunk);
                for (o, &x) in qbuf[(tt * nh + hh) * d..][..d].iter_mut().zip(src) {
                    *o = scale * x;
                }
            }
        }

        if int_keys.is_some() {
            for (r, s) in qscales.iter_mut().enumerate() {
                let at = r * d..(r + 1) * d;
                *s = row_q8::quantize_row(ops.isa, &qbuf[at.clone()], &mut qcodes[at]);
            }
            if ops.qk_q8.is_none() {
                for (o, &c) in qbuf.iter_mut().zip(qcodes.iter()) {
                    *o = c as f32;
                }
            }
        }

        // Scores. Rows masked for part of a chunk get harmless extra entries past their
        // visible length, which nothing reads.
        for s0 in (ks..ke).step_by(KEY_CHUNK) {
            let n = KEY_CHUNK.min(ke - s0);
            let r0 = first_row(s0);
            k.prefetch(job.b, job.kv_head, s0 + n, KEY_CHUNK.min(ke - s0 - n));
            if let Some((codes, scales)) = int_keys {
                let q = QRows {
                    codes: qcodes,
                    scales: qscales,
                    as_f32: qbuf,
                };
                let at = (job.b, job.kv_head, s0, n);
                let dst = &mut scores[r0 * nkeys + (s0 - ks)..];
                scores_q8::chunk_scores(ops, &q, r0, codes, scales, at, chunk, dst, nkeys);
                continue;
            }
            let (kc, ldk) = kv_rows_f32(ops, k, job.b, job.kv_head, s0, n, chunk);
            (ops.qk)(QkArgs {
                q: &qbuf[r0 * d..rows * d],
                rows: rows - r0,
                k: kc,
                ldk,
                keys: n,
                d,
                scores: &mut scores[r0 * nkeys + (s0 - ks)..],
                lds: nkeys,
            });
        }

        // Soft-capped scores, then softmax numerators in place; (max, denominator) kept per row.
        for r in 0..rows {
            let (from, to) = seen(r);
            let row = &mut scores[r * nkeys + from..r * nkeys + to];
            if let Some(cap) = params.softcap {
                (ops.softcap)(row, cap);
            }
            let (max, sum) = match to - from {
                0 => (f32::NEG_INFINITY, 0.0),
                _ => (ops.exp_sum)(row),
            };
            stats[2 * r] = max;
            stats[2 * r + 1] = sum;
        }
        if round_p {
            // bf16 attention: the numerators multiply V rounded to bf16 while the denominator
            // keeps their f32 sum. This is what torch's CPU flash attention does for bf16 (it
            // feeds bf16 probabilities to its P·V GEMM), so a bf16 model keeps its own numerics
            // and its own greedy tokens; without it ~20 % of outputs differ from torch by 1 ulp.
            for r in 0..rows {
                let (from, to) = seen(r);
                for x in &mut scores[r * nkeys + from..r * nkeys + to] {
                    *x = bf16_to_f32(f32_to_bf16(*x));
                }
            }
        }

        // Weighted sum of V rows; each row's accumulator lives in registers per chunk.
        acc.fill(0.0);
        if let Some((codes, scales)) = int_values {
            // Chunks at multiples of KEY_CHUNK positions (the codes' grouping depends on them).
            let mut seen_in = [(0usize, 0usize); MAX_ROWS];
            let mut vs = [0.0f32; KEY_CHUNK];
            for c in (ks / KEY_CHUNK..ke.div_ceil(KEY_CHUNK)).map(|c| c * KEY_CHUNK) {
                let (a0, e0) = (c.max(ks), (c + KEY_CHUNK).min(ke));
                let (c0, n, r0) = (a0 - ks, e0.saturating_sub(a0), first_row(a0));
                if n == 0 {
                    continue;
                }
                v.prefetch(job.b, job.kv_head, e0, KEY_CHUNK.min(ke - e0));
                for (r, o) in (r0..rows).zip(seen_in.iter_mut()) {
                    let (from, to) = seen(r);
                    let (a, b) = (from.max(c0), to.min(c0 + n));
                    *o = if a < b { (a - c0, b - c0) } else { (0, 0) };
                }
                vs.fill(0.0);
                for (i, o) in vs[..n].iter_mut().enumerate() {
                    *o = scales.data[scales.offset(job.b, job.kv_head, a0 + i)];
                }
                let off = codes.offset(job.b, job.kv_head, a0);
                let ldv = codes.strides[2];
                (ops.pv_q8)(PvQ8Args {
                    p: &scores[r0 * nkeys + c0..],
                    lds: nkeys,
                    seen: &seen_in[..rows - r0],
                    v: &codes.data[off..off + (n - 1) * ldv + d],
                    ldv,
                    vs: &vs,
                    keys: n,
                    d,
                    acc: &mut acc[r0 * d..rows * d],
                });
            }
        }
        for s0 in (ks..ke).step_by(KEY_CHUNK).filter(|_| int_values.is_none()) {
            let n = KEY_CHUNK.min(ke - s0);
            v.prefetch(job.b, job.kv_head, s0 + n, KEY_CHUNK.min(ke - s0 - n));
            let (vc, ldv) = kv_rows_f32(ops, v, job.b, job.kv_head, s0, n, chunk);
            let c0 = s0 - ks; // this chunk's keys, relative to ks: c0..c0 + n
            let range = |r: usize| {
                let (from, to) = seen(r);
                (from.max(c0), to.min(c0 + n))
            };
            // Runs of rows that see the same keys of this chunk (a token's heads; every token past
            // the chunk) go to `pv_rows` together, which shares each V load among them.
            let mut r = first_row(s0);
            while r < rows {
                let (a, b) = range(r);
                let mut e = r + 1;
                while e < rows && range(e) == (a, b) {
                    e += 1;
                }
                if a < b {
                    (ops.pv_rows)(PvArgs {
                        p: &scores[r * nkeys + a..],
                        lds: nkeys,
                        rows: e - r,
                        keys: b - a,
                        v: &vc[(a - c0) * ldv..],
                        ldv,
                        d,
                        acc: &mut acc[r * d..e * d],
                    });
                }
                r = e;
            }
        }

        for (tt, t) in job.tokens.clone().enumerate() {
            for (hh, h) in job.heads.clone().enumerate() {
                let r = tt * nh + hh;
                let acc_r = &acc[r * d..(r + 1) * d];
                match &sink {
                    Sink::Out(out) => {
                        let inv = 1.0 / stats[2 * r + 1];
                        let dst = out.0.add(out_offset(&q.dims, job.b, h, t));
                        for (i, &a) in acc_r.iter().enumerate() {
                            *dst.add(i) = E::from_f32(a * inv);
                        }
                    }
                    Sink::Partial(p) => {
                        let dst = p.0.add(r * (d + 2));
                        *dst = stats[2 * r];
                        *dst.add(1) = stats[2 * r + 1];
                        std::ptr::copy_nonoverlapping(acc_r.as_ptr(), dst.add(2), d);
                    }
                }
            }
        }
    });
}

/// Combines the `parts` partial results of one block (laid out part after part, each
/// `partials.len() / parts` floats) into normalised output rows: each part is rescaled by
/// exp(part max - overall max), in part order, all in f32.
pub(crate) fn merge<E: Element>(
    partials: &[f32],
    parts: usize,
    job: &Block,
    dims: &[usize; 4],
    out: &mut [E],
) {
    let d = dims[3];
    let slot = partials.len() / parts;
    let nh = job.heads.len();
    let mut row = vec![0.0f32; d];
    for (tt, t) in job.tokens.clone().enumerate() {
        for (hh, h) in job.heads.clone().enumerate() {
            let r = tt * nh + hh;
            let part = |p: usize| &partials[p * slot + r * (d + 2)..p * slot + (r + 1) * (d + 2)];
            let max = (0..parts)
                .filter(|&p| part(p)[1] > 0.0)
                .map(|p| part(p)[0])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut denom = 0.0f32;
            row.fill(0.0);
            for p in (0..parts).filter(|&p| part(p)[1] > 0.0) {
                let pr = part(p);
                let w = (pr[0] - max).exp();
                denom += w * pr[1];
                for (o, &a) in row.iter_mut().zip(&pr[2..]) {
                    *o += w * a;
                }
            }
            let inv = 1.0 / denom;
            let off = out_offset(dims, job.b, h, t);
            for (o, &x) in out[off..off + d].iter_mut().zip(&row) {
                *o = E::from_f32(x * inv);
            }
        }
    }
}
