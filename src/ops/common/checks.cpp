// Argument checks shared by the ops (input dtype, quant range, channel axis, devices, qparam
// shapes) and the helpers that build their outputs and TensorIterators (make_qparam_iter:
// Note [Qparam iterators] in cpu/loops.h).

#include "ops/common/checks.h"
#include "ops/common/output_buffers.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace mqbench {
namespace ops {
namespace detail {

void check_input(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.defined(), op, ": x is an undefined tensor");
  const auto st = x.scalar_type();
  TORCH_CHECK(st != at::kHalf && st != at::kBFloat16, op, ": x has dtype ", st,
              "; the CPU kernels compute in float32 or float64: call x.float() first");
  TORCH_CHECK(st == at::kFloat || st == at::kDouble, op,
              ": x must be a float32 or float64 tensor, got dtype ", st);
  TORCH_CHECK(x.layout() == at::kStrided, op, ": x must be a dense (strided) tensor, got layout ",
              x.layout());
}

void check_input_with_half(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.defined(), op, ": x is an undefined tensor");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16, op,
              ": x must be a float32, float64, float16 or bfloat16 tensor, got dtype ", st);
  TORCH_CHECK(x.layout() == at::kStrided, op, ": x must be a dense (strided) tensor, got layout ",
              x.layout());
}

void check_quant_range(int64_t quant_min, int64_t quant_max, const char* op) {
  TORCH_CHECK(quant_min <= quant_max, op, ": quant_min (", quant_min,
              ") must be <= quant_max (", quant_max, ")");
  // Quantized values are held exactly in float32 (24-bit mantissa).
  constexpr int64_t kLimit = int64_t(1) << 24;
  TORCH_CHECK(quant_min >= -kLimit && quant_max <= kLimit, op, ": the range [", quant_min, ", ",
              quant_max, "] exceeds +-2^24, which float32 cannot hold exactly");
}

int64_t wrap_channel_axis(int64_t ch_axis, const at::Tensor& x, const char* op) {
  const int64_t dim = x.dim();
  TORCH_CHECK(ch_axis >= -dim && ch_axis < dim, op, ": ch_axis (", ch_axis,
              ") is out of range for a ", dim, "-d input (valid: ", -dim, " to ", dim - 1, ")");
  return ch_axis < 0 ? ch_axis + dim : ch_axis;
}

void check_same_device(const at::Tensor& x, const at::Tensor& t, const char* name,
                       const char* op) {
  TORCH_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(), " but x is on ",
              x.device(), "; move them to the same device");
}

void check_devices(const char* op, const at::Tensor& x,
                   std::initializer_list<std::pair<at::Tensor, const char*>> others) {
  for (const auto& o : others) {
    if (o.first.defined()) check_same_device(x, o.first, o.second, op);
  }
}

double scalar_param(const at::Tensor& x, const at::Tensor& p, const char* name, const char* op) {
  TORCH_CHECK(p.defined(), op, ": ", name, " is an undefined tensor");
  check_same_device(x, p, name, op);
  TORCH_CHECK(at::isFloatingType(p.scalar_type()), op, ": ", name,
              " must be a floating-point tensor, got dtype ", p.scalar_type());
  TORCH_CHECK(p.numel() == 1, op, ": ", name, " must have exactly one element, got ",
              p.numel());
  const double v = p.detach().to(at::kCPU, at::kDouble).data_ptr<double>()[0];
  TORCH_CHECK(!std::isnan(v), op, ": ", name, " is NaN");
  return v;
}

std::pair<at::Tensor, at::Tensor> prepare_qparams(const at::Tensor& x, const at::Tensor& scale,
                                                  const at::Tensor& zero_point,
                                                  c10::optional<int64_t> axis, const char* op) {
  TORCH_CHECK(scale.defined() && zero_point.defined(), op,
              ": scale and zero_point must be defined tensors");
  check_same_device(x, scale, "scale", op);
  check_same_device(x, zero_point, "zero_point", op);
  TORCH_CHECK(at::isFloatingType(scale.scalar_type()), op,
              ": scale must be a floating-point tensor, got dtype ", scale.scalar_type());
  const auto zst = zero_point.scalar_type();
  TORCH_CHECK(zst != at::kBool && !at::isComplexType(zst), op,
              ": zero_point must be an integer or floating-point tensor, got dtype ", zst);

  const int64_t expected = axis ? x.size(*axis) : 1;
  if (axis) {
    TORCH_CHECK(scale.dim() <= 1 && zero_point.dim() <= 1, op,
                ": per-channel scale and zero_point must be 1-d, got shapes ", scale.sizes(),
                " and ", zero_point.sizes());
    TORCH_CHECK(scale.numel() == expected, op, ": scale has ", scale.numel(),
                " elements but x.size(", *axis, ") is ", expected);
    TORCH_CHECK(zero_point.numel() == expected, op, ": zero_point has ", zero_point.numel(),
                " elements but x.size(", *axis, ") is ", expected);
  } else {
    TORCH_CHECK(scale.numel() == 1, op, ": per-tensor scale must have one element, got ",
                scale.numel(), " (shape ", scale.sizes(), ")");
    TORCH_CHECK(zero_point.numel() == 1, op,
                ": per-tensor zero_point must have one element, got ", zero_point.numel(),
                " (shape ", zero_point.sizes(), ")");
  }

  auto scale_f = scale.detach().reshape({expected}).to(at::kFloat).contiguous();
  auto zp_f = zero_point.detach().reshape({expected}).to(at::kFloat).contiguous();
  if (scale_f.is_cpu()) {
    // Reading a CPU tensor is no host sync; the check costs O(channels).
    const float* s = scale_f.data_ptr<float>();
    for (int64_t c = 0; c < expected; ++c) {
      TORCH_CHECK(std::isfinite(s[c]) && s[c] > 0.f, op,
                  ": scale must be positive and finite, got scale[", c, "] = ", s[c]);
      // Below float32's smallest normal number 1/scale overflows and x = 0 maps to NaN.
      TORCH_CHECK(s[c] >= std::numeric_limits<float>::min(), op, ": scale[", c, "] = ", s[c],
                  " is below float32's smallest normal number (",
                  std::numeric_limits<float>::min(), "): its reciprocal overflows; observers "
                  "keep scales >= eps (1.19e-07)");
    }
    const float* z = zp_f.data_ptr<float>();
    for (int64_t c = 0; c < expected; ++c) {
      TORCH_CHECK(std::isfinite(z[c]), op, ": zero_point must be finite, got zero_point[", c,
                  "] = ", z[c]);
    }
  }
  return {scale_f, zp_f};
}

void check_like_x(const at::Tensor& x, const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  check_same_device(x, t, name, op);
  TORCH_CHECK(t.sizes() == x.sizes(), op, ": ", name, " must have x's shape ", x.sizes(),
              ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), op, ": ", name, " has dtype ",
              t.scalar_type(), " but x has dtype ", x.scalar_type());
}

double eps_value(const at::Tensor& eps, const char* op) {
  TORCH_CHECK(eps.defined() && eps.numel() == 1 && at::isFloatingType(eps.scalar_type()), op,
              ": eps must be a one-element floating-point tensor");
  const double e = eps.item<double>();
  TORCH_CHECK(std::isfinite(e) && e > 0, op, ": eps must be positive and finite, got ", e);
  return e;
}

void check_range_pair(const at::Tensor& a, const at::Tensor& b, const char* na, const char* nb,
                      const char* op) {
  TORCH_CHECK(a.defined() && b.defined(), op, ": ", na, " and ", nb, " must be defined");
  TORCH_CHECK(at::isFloatingType(a.scalar_type()) && at::isFloatingType(b.scalar_type()), op,
              ": ", na, " and ", nb, " must be floating-point tensors, got ", a.scalar_type(),
              " and ", b.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), op, ": ", na, " has ", a.numel(), " elements but ", nb,
              " has ", b.numel());
}

void check_grad(const at::Tensor& grad, const at::Tensor& x, const char* op) {
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": grad has shape ", grad.sizes(),
              " but x has shape ", x.sizes());
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), op, ": grad has dtype ",
              grad.scalar_type(), " but x has dtype ", x.scalar_type());
  check_same_device(x, grad, "grad", op);
}

at::TensorIterator make_qparam_iter(std::initializer_list<at::Tensor> outputs,
                                    std::initializer_list<at::Tensor> inputs,
                                    const at::Tensor& scale_f, const at::Tensor& zero_point_f,
                                    c10::optional<int64_t> axis) {
  const at::Tensor& first = *inputs.begin();
  at::Tensor s_view, z_view;
  if (axis) {
    std::vector<int64_t> shape(first.dim(), 1);
    shape[*axis] = first.size(*axis);
    s_view = scale_f.view(shape);
    z_view = zero_point_f.view(shape);
  } else {
    s_view = scale_f.view(at::IntArrayRef());  // not view({}): that picks view(ScalarType)
    z_view = zero_point_f.view(at::IntArrayRef());
  }
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false);
  for (const auto& o : outputs) config.add_owned_output(o);
  for (const auto& i : inputs) config.add_owned_input(i);
  config.add_owned_input(s_view);
  config.add_owned_input(z_view);
  return config.build();
}

// Note [Huge pages for large outputs]
// Large CPU tensors come straight from mmap (glibc's threshold is at most 32 MiB), so every
// call of an out-of-place op pays one page fault per 4 KiB of output: measured here, a fresh
// 64 MiB output costs ~21 ms to touch, 6x what our kernel needs to fill it. Advising the fresh
// range to use transparent huge pages before the kernel's first write cuts the faults 512-fold
// where THP is in "madvise" mode (Debian's default). The advice only applies to whole 2 MiB
// blocks inside the allocation, and is a no-op for memory already faulted in.
at::Tensor empty_output_like(const at::Tensor& x) {
  if (auto cached = cached_empty_like(x); cached.defined()) return cached;  // output_buffers.cpp
  auto out = at::empty_like(x, at::MemoryFormat::Preserve);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const size_t bytes = out.nbytes();
  if (out.is_cpu() && bytes >= 2 * kHuge) {
    const auto begin = reinterpret_cast<uintptr_t>(out.data_ptr());
    const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t last = (begin + bytes) & ~(kHuge - 1);
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#endif
  return out;
}

at::Tensor sums_like(const double* sums, const at::Tensor& like) {
  // An integer zero point gets no gradient from autograd; give the (unused) sums as float.
  const auto dtype = at::isFloatingType(like.scalar_type()) ? like.scalar_type() : at::kFloat;
  auto out = at::empty({like.numel()}, at::TensorOptions().dtype(at::kDouble));
  std::copy(sums, sums + like.numel(), out.data_ptr<double>());
  return out.to(dtype).view(like.sizes()).to(like.device());
}

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
