// kwker_ffi.h — the C interface between the C++ registration layer (ops.cpp) and the Rust kernels
// (csrc-shim/src/lib.rs). Plain pointers, sizes and dtype codes; no torch types cross it.
//
// Contract: every function returns 0 on success. On failure it returns non-zero and writes a
// NUL-terminated, human-readable message into `err` (at most `err_len` bytes). Rust panics never cross
// this boundary: they are caught and reported the same way.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// dtype codes shared by both sides.
#define KWKER_F32 0
#define KWKER_BF16 1
#define KWKER_NONE (-1)

// y[m, n] = x[m, k] @ w[n, k]^T (+ bias[n]); all contiguous row-major. x and y share x_dtype.
// Sums in float32; a bf16 output is rounded once, at the end.
int32_t kwker_linear(const void* x, int32_t x_dtype, int64_t m, int64_t k,
                     const void* w, int32_t w_dtype, int64_t n,
                     const void* bias, int32_t bias_dtype,
                     void* y, char* err, size_t err_len);

// out[B, Hq, T, D] (contiguous) = causal-from-the-end attention of q over k/v. dims/strides are
// 4 int64 each, strides in elements with stride[3] == 1. q, k, v, out share `dtype`.
int32_t kwker_decode_attention(int32_t dtype,
                               const void* q, const int64_t* q_dims, const int64_t* q_strides,
                               const void* k, const int64_t* k_dims, const int64_t* k_strides,
                               const void* v, const int64_t* v_dims, const int64_t* v_strides,
                               float scale, void* out, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
