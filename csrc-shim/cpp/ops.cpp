// ops.cpp — registers torch.ops.kwker.* with PyTorch's dispatcher through the stable ABI
// (torch/csrc/stable, torch >= 2.10) and forwards to the Rust kernels through kwker_ffi.h.
//
// This layer only validates and dispatches: it checks device, dtype, rank, sizes and strides, makes
// non-contiguous inputs contiguous where the result is still well defined, allocates the output, and
// turns any kernel error into a C++ exception (a Python RuntimeError starting with "kwker::<op>:").
// Numerics live in Rust: float32 accumulation, one rounding to the output dtype.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kwker_ffi.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

template <typename... Args>
[[noreturn]] void fail(const char* op, const Args&... args) {
  std::ostringstream os;
  os << "kwker::" << op << ": ";
  (os << ... << args);
  throw std::runtime_error(os.str());
}

#define KWKER_CHECK(cond, op, ...) \
  do {                             \
    if (!(cond)) fail(op, __VA_ARGS__); \
  } while (0)

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Half: return "float16";
    case ScalarType::Double: return "float64";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
    default: return "an unsupported dtype";
  }
}

int32_t dtype_code(ScalarType t) {
  if (t == ScalarType::Float) return KWKER_F32;
  if (t == ScalarType::BFloat16) return KWKER_BF16;
  return KWKER_NONE;
}

std::string shape(const Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

void check_cpu(const char* op, const char* name, const Tensor& t) {
  KWKER_CHECK(t.is_cpu(), op, "expected '", name, "' on the CPU, got a tensor on device type ",
              static_cast<int>(t.device().type()), "; move it with .cpu()");
}

int32_t check_float(const char* op, const char* name, const Tensor& t) {
  const int32_t code = dtype_code(t.scalar_type());
  KWKER_CHECK(code != KWKER_NONE, op, "expected '", name, "' to be float32 or bfloat16, got ",
              dtype_name(t.scalar_type()));
  return code;
}

// A new contiguous CPU tensor of x's dtype. aoti_torch_empty_strided is a plain C call into
// libtorch (stable ABI); new_empty would go through the dispatcher, ~1.5 µs more per op call.
Tensor empty_cpu(const char* op, const std::vector<int64_t>& sizes, ScalarType dtype) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  const int32_t code = dtype == ScalarType::Float ? aoti_torch_dtype_float32() : aoti_torch_dtype_bfloat16();
  AtenTensorHandle handle = nullptr;
  const AOTITorchError rc = aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(),
                                                     strides.data(), code, aoti_torch_device_type_cpu(), 0,
                                                     &handle);
  KWKER_CHECK(rc == AOTI_TORCH_SUCCESS && handle != nullptr, op, "could not allocate the output tensor");
  return Tensor(handle);
}

Tensor dense(const Tensor& t) {
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

void raise_if_failed(const char* op, int32_t rc, const std::array<char, 1024>& err) {
  if (rc != 0) fail(op, err.data());
}

Tensor linear(Tensor x, Tensor weight, std::optional<Tensor> bias) {
  const char* op = "linear";
  check_cpu(op, "x", x);
  check_cpu(op, "weight", weight);
  KWKER_CHECK(x.dim() >= 1, op, "expected x of shape [..., K], got a 0-d tensor");
  KWKER_CHECK(weight.dim() == 2, op, "expected weight of shape [N, K], got shape ", shape(weight));
  const int32_t x_dtype = check_float(op, "x", x);
  const int32_t w_dtype = check_float(op, "weight", weight);
  const int64_t k = x.size(-1);
  const int64_t n = weight.size(0);
  KWKER_CHECK(weight.size(1) == k, op, "x has ", k, " features (last dim of shape ", shape(x),
              ") but weight has shape ", shape(weight), "; expected weight of shape [N, ", k, "]");
  int32_t b_dtype = KWKER_NONE;
  const void* b_ptr = nullptr;
  std::optional<Tensor> b;
  if (bias.has_value()) {
    check_cpu(op, "bias", *bias);
    b_dtype = check_float(op, "bias", *bias);
    KWKER_CHECK(bias->dim() == 1 && bias->size(0) == n, op, "expected bias of shape [", n,
                "] (one value per output feature), got shape ", shape(*bias));
    b = dense(*bias);
    b_ptr = b->data_ptr();
  }
  // Rows of x: the product of all leading dims (works when K == 0 too).
  int64_t m = 1;
  std::vector<int64_t> out_sizes;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) {
    m *= x.size(i);
    out_sizes.push_back(x.size(i));
  }
  out_sizes.push_back(n);
  Tensor out = empty_cpu(op, out_sizes, x.scalar_type());
  if (m == 0 || n == 0) return out;
  const Tensor xc = dense(x);
  const Tensor wc = dense(weight);
  std::array<char, 1024> err{};
  raise_if_failed(op, kwker_linear(xc.data_ptr(), x_dtype, m, k, wc.data_ptr(), w_dtype, n, b_ptr,
                                   b_dtype, out.data_ptr(), err.data(), err.size()),
                  err);
  return out;
}

// Attention tensors may be strided views (q is usually a transpose of [B, T, H, D]); only the last
// dim must be dense, otherwise the tensor is copied.
Tensor last_dim_dense(const Tensor& t) {
  return (t.size(3) <= 1 || t.stride(3) == 1) ? t : torch::stable::contiguous(t);
}

Tensor decode_attention(Tensor q, Tensor k, Tensor v, double scale) {
  const char* op = "decode_attention";
  check_cpu(op, "q", q);
  check_cpu(op, "k", k);
  check_cpu(op, "v", v);
  KWKER_CHECK(q.dim() == 4, op, "expected q of shape [B, Hq, T, D], got shape ", shape(q));
  KWKER_CHECK(k.dim() == 4, op, "expected k of shape [B, Hkv, S, D], got shape ", shape(k));
  KWKER_CHECK(v.dim() == 4, op, "expected v of shape [B, Hkv, S, D], got shape ", shape(v));
  const int32_t dtype = check_float(op, "q", q);
  KWKER_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
              "expected q, k and v of one dtype, got ", dtype_name(q.scalar_type()), ", ",
              dtype_name(k.scalar_type()), " and ", dtype_name(v.scalar_type()));
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  KWKER_CHECK(k.size(0) == B && v.size(0) == B, op, "batch sizes differ: q ", shape(q), ", k ",
              shape(k), ", v ", shape(v));
  KWKER_CHECK(k.size(3) == D && v.size(3) == D, op, "head dims differ: q ", shape(q), ", k ",
              shape(k), ", v ", shape(v));
  KWKER_CHECK(v.size(1) == Hkv && v.size(2) == S, op, "k ", shape(k), " and v ", shape(v),
              " must have the same shape");
  KWKER_CHECK((Hkv > 0 && Hq % Hkv == 0) || (Hkv == 0 && Hq == 0), op,
              "grouped-query attention needs Hq to be a multiple of Hkv, got Hq=", Hq,
              " and Hkv=", Hkv);
  KWKER_CHECK(T <= S, op, "q has T=", T, " new tokens but the cache holds only S=", S,
              " keys; the cache must already contain the new tokens' keys");
  KWKER_CHECK(std::isfinite(scale), op, "scale must be finite, got ", scale);
  Tensor out = empty_cpu(op, {B, Hq, T, D}, q.scalar_type());
  if (B == 0 || Hq == 0 || T == 0 || D == 0) return out;
  const Tensor qd = last_dim_dense(q), kd = last_dim_dense(k), vd = last_dim_dense(v);
  std::array<int64_t, 4> qs{}, ks{}, vs{}, qz{}, kz{}, vz{};
  for (int i = 0; i < 4; ++i) {
    qz[i] = qd.size(i), kz[i] = kd.size(i), vz[i] = vd.size(i);
    qs[i] = qd.stride(i), ks[i] = kd.stride(i), vs[i] = vd.stride(i);
  }
  // A size-1 last dim may carry any stride; the kernel only needs "dense".
  qs[3] = ks[3] = vs[3] = 1;
  std::array<char, 1024> err{};
  raise_if_failed(op,
                  kwker_decode_attention(dtype, qd.data_ptr(), qz.data(), qs.data(), kd.data_ptr(),
                                         kz.data(), ks.data(), vd.data_ptr(), vz.data(), vs.data(),
                                         static_cast<float>(scale), out.data_ptr(), err.data(),
                                         err.size()),
                  err);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY(kwker, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(kwker, CPU, m) {
  m.impl("linear", TORCH_BOX(&linear));
  m.impl("decode_attention", TORCH_BOX(&decode_attention));
}
