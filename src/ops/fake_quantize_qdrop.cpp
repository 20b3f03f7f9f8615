// QDrop (Wei et al. 2022, "QDrop: Randomly Dropping Quantization for Extremely Low-bit
// Post-Training Quantization"): each element is fake-quantized with probability `prob` and kept
// as x otherwise:
//   out = where(rand_like(x) < prob, fq(x), x)
// fq is the LSQ op with grad_factor 1 (MQBench's QDrop computes the same value with
// round(x / s) and lets autograd give the scale the LSQ gradient); the random numbers come
// from torch's default generator, drawn after quantizing as MQBench does, so torch.manual_seed
// reproduces them. A composite op: autograd differentiates through its parts.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

at::Tensor drop(const char* op, const at::Tensor& x, const at::Tensor& quantized, double prob) {
  TORCH_CHECK(prob >= 0.0 && prob <= 1.0, op, ": prob must be in [0, 1], got ", prob);
  if (prob >= 1.0) return quantized;
  return at::where(at::rand_like(x) < prob, quantized, x);
}

at::Tensor per_tensor(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                      int64_t qmin, int64_t qmax, double prob) {
  return drop("fake_quantize_qdrop_per_tensor", x,
              fake_quantize_learnable_per_tensor_affine(x, scale, zero_point, qmin, qmax, 1.0),
              prob);
}

at::Tensor per_channel(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                       int64_t ch_axis, int64_t qmin, int64_t qmax, double prob) {
  return drop(
      "fake_quantize_qdrop_per_channel", x,
      fake_quantize_learnable_per_channel_affine(x, scale, zero_point, ch_axis, qmin, qmax, 1.0),
      prob);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_qdrop_per_tensor(Tensor x, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max, float prob=1.0) -> Tensor");
  m.def("fake_quantize_qdrop_per_channel(Tensor x, Tensor scale, Tensor zero_point, "
        "int ch_axis, int quant_min, int quant_max, float prob=1.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("fake_quantize_qdrop_per_tensor", TORCH_FN(per_tensor));
  m.impl("fake_quantize_qdrop_per_channel", TORCH_FN(per_channel));
}

at::Tensor fake_quantize_qdrop_per_tensor(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t quant_min,
                                          int64_t quant_max, double prob) {
  static auto op = detail::op_handle<decltype(fake_quantize_qdrop_per_tensor)>(
      "mqbench::fake_quantize_qdrop_per_tensor");
  return op.call(x, scale, zero_point, quant_min, quant_max, prob);
}

at::Tensor fake_quantize_qdrop_per_channel(const at::Tensor& x, const at::Tensor& scale,
                                           const at::Tensor& zero_point, int64_t ch_axis,
                                           int64_t quant_min, int64_t quant_max, double prob) {
  static auto op = detail::op_handle<decltype(fake_quantize_qdrop_per_channel)>(
      "mqbench::fake_quantize_qdrop_per_channel");
  return op.call(x, scale, zero_point, ch_axis, quant_min, quant_max, prob);
}

}  // namespace ops
}  // namespace mqbench
