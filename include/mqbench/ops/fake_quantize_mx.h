#pragma once
// Block-scaled floating-point fake quantization (OCP MX and NVIDIA NVFP4). Each op is
// `torch.ops.mqbench.<name>` in Python; formulas and edge cases in docs/ops.md and
// docs/formats-mx.md.

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

namespace mqbench {
namespace ops {

/// OCP MX fake quantization: blocks of `block_size` (the spec's 32) consecutive elements along
/// `axis` share one power-of-two (E8M0) scale 2^(floor(log2(amax)) - emax_elem); each element is
/// rounded (ties to even, saturating) to `elem_dtype`'s grid: "mxfp8_e4m3" (FP8 E4M3FN),
/// "mxfp6_e3m2" (FP6 E3M2, largest 28), "mxfp6_e2m3" (FP6 E2M3, largest 7.5) or "mxfp4" (FP4
/// E2M1). x: any shape, float32 / float64 (CUDA: also half / bfloat16); the output
/// has x's shape and dtype, contiguous. Gradient: straight-through.
///   auto y = mqbench::ops::fake_quantize_mx(w, "mxfp4");   // w: [out, in], blocks along in
at::Tensor fake_quantize_mx(const at::Tensor& x, c10::string_view elem_dtype,
                            int64_t block_size = 32, int64_t axis = -1);

/// NVFP4 fake quantization: FP4 E2M1 elements, one FP8 E4M3 scale per `block_size` (16)
/// elements along `axis`, times the per-tensor FP32 scale global_amax / (448 * 6).
/// `global_amax` (one element) is the tensor's max |x| from an observer.
at::Tensor fake_quantize_nvfp4(const at::Tensor& x, const at::Tensor& global_amax,
                               int64_t block_size = 16, int64_t axis = -1);

}  // namespace ops
}  // namespace mqbench
