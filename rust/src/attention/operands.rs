//! The operands of the per-tier score and weighted-sum kernels (`Ops::qk`, `Ops::pv_rows`, `pv`),
//! with the shape checks every tier needs before it reads through raw pointers. One struct per
//! kernel instead of eight positional arguments, so the tiers share one signature and one set of
//! checks.
//!
//! Numerical contract: none of its own; nothing here touches a value.

/// Operands of `qk`: scores[r*lds + s] = dot(q[r*d..][..d], k[s*ldk..][..d]) for r < rows, s < keys.
pub(crate) struct QkArgs<'a> {
    pub q: &'a [f32],
    pub rows: usize,
    pub k: &'a [f32],
    /// Stride of k's rows, in floats.
    pub ldk: usize,
    pub keys: usize,
    pub d: usize,
    pub scores: &'a mut [f32],
    /// Stride of the score rows, in floats.
    pub lds: usize,
}

impl QkArgs<'_> {
    /// Whether there is work (rows and keys non-zero). Panics when a slice is shorter than the
    /// shape needs, so a tier may then index through raw pointers.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        if self.rows == 0 || self.keys == 0 {
            return false;
        }
        assert!(self.q.len() >= self.rows * self.d, "qk: q too short");
        let k_needs = (self.keys - 1) * self.ldk + self.d;
        assert!(self.k.len() >= k_needs, "qk: k too short");
        let scores_need = (self.rows - 1) * self.lds + self.keys;
        assert!(self.scores.len() >= scores_need, "qk: scores too short");
        true
    }
}

/// Operands of `pv_rows`: acc[r*d..][..d] += sum over s < keys of p[r*lds + s] * v[s*ldv..][..d]
/// for r < rows.
pub(crate) struct PvArgs<'a> {
    pub p: &'a [f32],
    /// Stride of the weight rows, in floats.
    pub lds: usize,
    pub rows: usize,
    pub keys: usize,
    pub v: &'a [f32],
    /// Stride of v's rows, in floats.
    pub ldv: usize,
    pub d: usize,
    pub acc: &'a mut [f32],
}

impl PvArgs<'_> {
    /// Whether there is work (rows and keys non-zero). Panics when a slice is shorter than the
    /// shape needs, so a tier may then index through raw pointers.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        if self.rows == 0 || self.keys == 0 {
            return false;
        }
        let p_needs = (self.rows - 1) * self.lds + self.keys;
        assert!(self.p.len() >= p_needs, "pv_rows: p too short");
        let v_needs = (self.keys - 1) * self.ldv + self.d;
        assert!(self.v.len() >= v_needs, "pv_rows: v too short");
        assert!(
            self.acc.len() >= self.rows * self.d,
            "pv_rows: acc too short"
        );
        true
    }

    /// Runs these operands (after `has_work`) three rows at a time through `three(args, r, acc)`,
    /// which must add rows r..r + 3 into the accumulator rows at `acc` (the start of `args.acc`, so
    /// row i starts at acc + i*d), then the remaining rows one at a time through the tier's
    /// one-row `pv`.
    ///
    /// # Safety
    /// `three` must stay within the three rows it is given and `pv` must be callable (its CPU
    /// features present); both then see only operands `has_work` has validated.
    #[inline(always)]
    pub(crate) unsafe fn in_threes(
        self,
        mut three: impl FnMut(&Self, usize, *mut f32),
        pv: unsafe fn(&[f32], &[f32], usize, usize, &mut [f32]),
    ) {
        let mut args = self;
        if !args.has_work() {
            return;
        }
        let (rows, v, ldv, d) = (args.rows, args.v, args.ldv, args.d);
        let acc = args.acc.as_mut_ptr();
        let mut r = 0;
        while r + 3 <= rows {
            three(&args, r, acc);
            r += 3;
        }
        for r in r..rows {
            let (p, acc) = args.row(r);
            pv(p, v, ldv, d, acc);
        }
    }

    /// The operands of a kernel over rows r.. and columns c.., given the accumulator's start
    /// `acc`: (p + r*lds, v + c, acc + r*d + c, lds, keys, ldv, d).
    #[inline(always)]
    pub(crate) unsafe fn rows_at(&self, r: usize, c: usize, acc: *mut f32) -> RowsAt {
        let p = self.p.as_ptr().add(r * self.lds);
        let (v, acc) = (self.v.as_ptr().add(c), acc.add(r * self.d + c));
        (p, v, acc, self.lds, self.keys, self.ldv, self.d)
    }

    /// Row r's weights and accumulator, the operands of a one-row `pv`:
    /// (p[r*lds..][..keys], acc[r*d..][..d]).
    #[inline]
    pub(crate) fn row(&mut self, r: usize) -> (&[f32], &mut [f32]) {
        let (lds, d) = (self.lds, self.d);
        (
            &self.p[r * lds..r * lds + self.keys],
            &mut self.acc[r * d..(r + 1) * d],
        )
    }
}

/// What `PvArgs::rows_at` returns: (weights, V columns, accumulators, lds, keys, ldv, lda), the
/// strides of the three in floats.
pub(crate) type RowsAt = (*const f32, *const f32, *mut f32, usize, usize, usize, usize);

/// Whether a one-row `pv(p, v, ldv, d, acc)` has work (a key); panics when acc does not hold
/// exactly d values or v is shorter than the keys need, so a tier may then use raw pointers.
#[inline]
pub(crate) fn pv_has_work(p: &[f32], v: &[f32], ldv: usize, d: usize, acc: &[f32]) -> bool {
    assert_eq!(acc.len(), d, "pv: acc must hold exactly d values");
    if p.is_empty() {
        return false;
    }
    assert!(v.len() >= (p.len() - 1) * ldv + d, "pv: v too short");
    true
}

/// (first column, width) of the column blocks of at most `width` columns that cover 0..d.
#[inline]
pub(crate) fn col_blocks(d: usize, width: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..d)
        .step_by(width)
        .map(move |c0| (c0, (d - c0).min(width)))
}
