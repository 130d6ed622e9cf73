"""GPTQ (Frantar et al., 2022) for the decoder's quantized formats: each matrix's codes chosen column by column,
every column's rounding error carried onto the columns not yet quantized through the inverse Hessian of the
layer's inputs, so the product X Wᵀ (not W itself) stays closest to the float one on the calibration text.

Numerical contract: what is stored is exactly a format's own block layout (``Builder.set_coded``: the scales the
library's quantizer fits, then GPTQ's codes under them), so every kernel reads it as any other matrix of that
format. The Hessian H = Σ xᵀx of each matrix's input rows is summed in float32 over the calibration text, run
through the model's own float forward (inputs are not re-quantized layer by layer: every matrix sees the float
model's activations). H is damped by ``damp`` x mean(diag H) (GPTQ's 1 %); its inverse's upper Cholesky factor
drives the updates, in column blocks of 256 with the rest of the matrix updated once per block ("lazy batch").

The grid: a format's scales (q4k/q6k: per 256-value super-block; q4, q8_0: per 32; q8: per 64) are fitted
when GPTQ reaches the block's first column, to the block's values as the earlier columns' errors have left them
and with the same importance as ``calib=`` alone (diag H / tokens): the grid is fitted to the values GPTQ is
about to round, as plain calibrated quantization fits it to the original ones. ``act_order=True`` fits the
grid once on the original matrix and then quantizes columns in decreasing order of diag H (the "static groups"
variant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import native, plan

BLOCK_COLS = 256  # columns per lazy-batch block: a multiple of every fit unit below
SUB_COLS = 32  # columns per inner block (rank-1 updates within it); every fit unit is a multiple of it
ROW_CHUNK = 2048  # rows quantized together: a 256-column block of them (2 MB) stays in L2
DAMP = 0.01
Key = tuple[str, int, int]


def fit_unit(fmt: str) -> int:
    """Columns whose scales are fitted together: a super-block for q4k/q6k, a block otherwise."""
    f = native.QUANT_FORMATS[fmt]
    return 256 if f["super_row_bytes"] else int(f["granule"])


def _inverse_factor(h: torch.Tensor, damp: float, what: str) -> torch.Tensor:
    """The upper Cholesky factor of (H + damp·mean(diag H)·I)⁻¹; columns no token reached get H_ii = 1."""
    h = h.clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    h.diagonal().add_(damp * torch.diagonal(h).mean())
    try:
        low = torch.linalg.cholesky(h.double())
        inv = torch.cholesky_inverse(low)
        return torch.linalg.cholesky(inv, upper=True).float()
    except torch.linalg.LinAlgError as e:
        raise ValueError(
            f"kwker: GPTQ: the Hessian of {what} is not positive definite even after damping {damp}; "
            "calibrate on more text, or quantize this matrix without GPTQ (gptq=False)"
        ) from e


def quantize(w: torch.Tensor, h: torch.Tensor, tokens: int, fmt: str, *, act_order: bool = False,
             damp: float = DAMP, what: str = "a matrix") -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """GPTQ of one matrix ``w`` (float [rows, cols]) under format ``fmt`` with input Hessian ``h`` (Σ xᵀx over
    ``tokens`` rows): (fit values float32 [rows, cols], codes uint8 [rows, cols]), what ``Builder.set_coded``
    stores. The quantized values are ``step * code + offset`` of the grid ``native.quant_grid`` fits to the fit
    values (with importance diag(h) / tokens)."""
    w = w.detach().float()
    rows, cols = w.shape
    imp = (torch.diagonal(h) / max(tokens, 1)).contiguous()
    perm = torch.argsort(torch.diagonal(h), descending=True) if act_order else None
    u = _inverse_factor(h if perm is None else h[perm][:, perm], damp, what)
    fit = torch.empty(rows, cols)
    codes = torch.empty(rows, cols, dtype=torch.uint8)
    # Rows are independent (each has its own grid and its own errors): in chunks that stay in cache.
    for r0 in range(0, rows, ROW_CHUNK):
        r1 = min(r0 + ROW_CHUNK, rows)
        fit[r0:r1], codes[r0:r1] = _rows(w[r0:r1], u, imp, fmt, perm)
    return fit, codes


def _rows(w: torch.Tensor, u: torch.Tensor, imp: torch.Tensor, fmt: str,
          perm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``quantize`` of some rows, with the inverse Hessian's factor ``u`` (of the permuted columns if ``perm``)."""
    rows, cols = w.shape
    unit = fit_unit(fmt)
    fit = torch.empty(rows, cols)
    fallback = torch.empty(rows, cols, dtype=torch.uint8)  # the quantizer's own codes, used where step == 0
    # Each 32-value sub-block's step and offset (columns-first), filled as units are fitted; sub[col] = its index.
    step, offset = torch.empty(cols // 32, rows), torch.empty(cols // 32, rows)
    den, live = torch.empty(cols // 32, rows), torch.empty(cols // 32, rows, dtype=torch.bool)  # step, 1 where 0
    sub = (torch.arange(cols) // 32).tolist()
    rng = [0.0, 0.0]

    def fit_unit_at(c0: int, values: torch.Tensor) -> None:
        c1 = c0 + values.shape[1]
        c, st, off, (lo, hi) = native.quant_grid(fmt, values, imp[c0:c1])
        fit[:, c0:c1], fallback[:, c0:c1] = values, c
        step[c0 // 32 : c1 // 32], offset[c0 // 32 : c1 // 32] = st.T, off.T
        live[c0 // 32 : c1 // 32] = st.T != 0
        den[c0 // 32 : c1 // 32] = torch.where(live[c0 // 32 : c1 // 32], st.T, 1.0)
        rng[:] = [float(lo), float(hi)]

    # Columns-first from here: a column is a contiguous vector and rank-1 updates run along rows.
    wt = w.T.contiguous()
    if perm is not None:  # static grid: fitted once on the original values, then columns by decreasing energy
        for c0 in range(0, cols, unit):
            fit_unit_at(c0, w[:, c0 : min(c0 + unit, cols)].contiguous())
        wt, fallback, sub = wt[perm], fallback[:, perm], [sub[i] for i in perm.tolist()]
    fb = fallback.T.contiguous().float()
    codes = torch.empty(cols, rows)
    for b0 in range(0, cols, BLOCK_COLS):
        b1 = min(b0 + BLOCK_COLS, cols)
        err = torch.empty(b1 - b0, rows)
        # Two levels of lazy updates: rank-1 inside SUB_COLS columns, a product for the rest of the block.
        for s0 in range(b0, b1, SUB_COLS):
            s1 = min(s0 + SUB_COLS, b1)
            for col in range(s0, s1):
                if perm is None and col % unit == 0:  # unit starts are sub-block starts: its columns are current
                    fit_unit_at(col, wt[col : min(col + unit, cols)].T.contiguous())
                sb, x = sub[col], wt[col]
                # floor(t + 0.5) then the clamp: round-half-away-from-zero's result wherever the clamp
                # keeps it (t >= -0.5), and the lowest code below (every format's lowest code is >= 0).
                c = ((x - offset[sb]) / den[sb]).add_(0.5).floor_().clamp_(*rng)
                c = torch.where(live[sb], c, fb[col])
                codes[col] = c
                e = (x - (step[sb] * c + offset[sb])) / u[col, col]
                wt[col:s1] -= u[col, col:s1, None] * e[None, :]
                err[col - b0] = e
            wt[s1:b1] -= u[s0:s1, s1:b1].T @ err[s0 - b0 : s1 - b0]
        wt[b1:] -= u[b0:b1, b1:].T @ err
    out = codes.T.to(torch.uint8)
    if perm is not None:
        out = out[:, torch.argsort(perm)]
    return fit, out.contiguous()


def hessians(model: torch.nn.Module, ids: torch.Tensor, modules: dict[Key, tuple[Any, Any]],
             desc: str) -> dict[Key, tuple[torch.Tensor, int]]:  # fmt: skip
    """Σ xᵀx (float32 [cols, cols]) and the row count of every matrix's inputs over ``ids``."""
    return plan.run_inputs(model, ids, modules, lambda x: x.T @ x, desc)


def memory_budget() -> int:
    """Bytes of Hessians held at once: a quarter of the machine's memory, at most 2 GiB."""
    from .common import mem_total

    total = mem_total() or 8 << 30
    return min(2 << 30, total // 4)


def run(model: torch.nn.Module, ids: torch.Tensor, jobs: list[tuple[Key, Key, Any, Any, torch.Tensor, str]],
        store: Callable[[Key, str, torch.Tensor, torch.Tensor, torch.Tensor], None], *, act_order: bool = False,
        budget: int | None = None) -> list[Key]:  # fmt: skip
    """GPTQ of every job (key, Hessian key, module, rows picker, weight, format), in groups whose Hessians fit
    ``budget`` bytes (one forward over ``ids`` per group), calling ``store(key, fmt, fit, codes, importance)``
    for each. Returns the keys done; a job whose matrix saw no token (an expert never routed to) is left out."""
    from tqdm.auto import tqdm

    budget = budget or memory_budget()
    groups: list[list[Any]] = [[]]
    used = 0
    for job in jobs:
        need = job[4].shape[1] ** 2 * 4
        if groups[-1] and used + need > budget:
            groups.append([])
            used = 0
        groups[-1].append(job)
        used += need
    done: list[Key] = []
    bar = tqdm(total=len(jobs), desc="kwker: GPTQ", unit="matrix")
    for gi, group in enumerate(groups):
        modules = {hk: (mod, rows) for _, hk, mod, rows, _, _ in group}
        desc = "kwker: GPTQ inputs" + (f" ({gi + 1}/{len(groups)})" if len(groups) > 1 else "")
        hs = hessians(model, ids, modules, desc)
        for key, hk, _, _, w, fmt in group:
            if hk in hs:
                h, n = hs[hk]
                what = f"{key[0]} of layer {key[1]}" + (f", expert {key[2]}" if key[2] else "")
                fit, codes = quantize(w, h, n, fmt, act_order=act_order, what=what)
                store(key, fmt, fit, codes, (torch.diagonal(h) / n).contiguous())
                done.append(key)
            bar.update(1)
        del hs
    bar.close()
    return done
