// Block-scaled floating-point fake quantization: OCP MX (MXFP8 E4M3, MXFP6 E3M2 / E2M3, MXFP4 E2M1;
// shared E8M0 scale per 32 elements) and NVIDIA NVFP4 (E2M1, an E4M3 scale per 16 elements times a
// per-tensor FP32 scale from the tensor's amax). Schemas, the CPU op and the C++ entry points of
// include/mqbench/ops/fake_quantize_mx.h. Formulas: Note [MX and NVFP4 block formulas] in
// ops/common/mx_formula.h; kernels cpu/mx_kernel.cpp and cuda/mx_kernel.cu; autograd
// (straight-through) autograd/mx_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "mqbench/ops/fake_quantize_mx.h"
#include "ops/common/checks.h"
#include "ops/common/mx_formula.h"
#include "ops/common/mx_layout.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/mx_kernel.h"

namespace mqbench {
namespace cpu {

MQBENCH_DEFINE_STUB(mx_fwd_stub, mx_fwd_fn);
MQBENCH_DEFINE_STUB(nvfp4_fwd_stub, nvfp4_fwd_fn);

}  // namespace cpu

namespace ops {
namespace {

constexpr const char* kMx = "fake_quantize_mx";
constexpr const char* kNvfp4 = "fake_quantize_nvfp4";

// Runs `kernel(x, out, rows, cols)` on x laid out by block_layout, in float32 (float64 input is
// computed in float32, as the references do: the formats hold far fewer bits), and returns the
// result in x's dtype and shape (contiguous).
template <typename Kernel>
at::Tensor run_blocks(const at::Tensor& x, int64_t block_size, int64_t axis, const char* op,
                      const Kernel& kernel) {
  detail::check_input(x, op);
  auto l = detail::block_layout(x, block_size, axis, op);
  const auto xf = l.x.scalar_type() == at::kFloat ? l.x : l.x.to(at::kFloat);
  auto out = detail::empty_output_like(xf);  // contiguous, as xf
  if (l.rows > 0) kernel(xf.data_ptr<float>(), out.data_ptr<float>(), l.rows, l.cols);
  return detail::from_block_layout(out.to(x.scalar_type()), l, x);
}

at::Tensor mx_cpu(const at::Tensor& x, c10::string_view elem_dtype, int64_t block_size,
                  int64_t axis) {
  const auto elem = detail::mx_element(std::string(elem_dtype), kMx);
  return run_blocks(x, block_size, axis, kMx,
                    [&](const float* in, float* out, int64_t rows, int64_t cols) {
                      cpu::mx_fwd_stub.get()(in, out, rows, cols, block_size, elem);
                    });
}

at::Tensor nvfp4_cpu(const at::Tensor& x, const at::Tensor& global_amax, int64_t block_size,
                     int64_t axis) {
  detail::check_input(x, kNvfp4);
  const double amax = detail::scalar_param(x, global_amax, "global_amax", kNvfp4);
  TORCH_CHECK(std::isfinite(amax) && amax >= 0.0, kNvfp4,
              ": global_amax must be finite and >= 0, got ", amax,
              "; observe data (enable the observer) before enabling fake quantization");
  const float g = detail::nvfp4_global_scale(static_cast<float>(amax));
  return run_blocks(x, block_size, axis, kNvfp4,
                    [&](const float* in, float* out, int64_t rows, int64_t cols) {
                      cpu::nvfp4_fwd_stub.get()(in, out, rows, cols, block_size, g);
                    });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_mx(Tensor x, str elem_dtype, int block_size=32, int axis=-1) -> Tensor");
  m.def("fake_quantize_nvfp4(Tensor x, Tensor global_amax, int block_size=16, int axis=-1) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_mx", TORCH_FN(mx_cpu));
  m.impl("fake_quantize_nvfp4", TORCH_FN(nvfp4_cpu));
}

// ---- C++ entry points ------------------------------------------------------------------------

at::Tensor fake_quantize_mx(const at::Tensor& x, c10::string_view elem_dtype, int64_t block_size,
                            int64_t axis) {
  static auto op = detail::op_handle<decltype(fake_quantize_mx)>("mqbench::fake_quantize_mx");
  return op.call(x, elem_dtype, block_size, axis);
}

at::Tensor fake_quantize_nvfp4(const at::Tensor& x, const at::Tensor& global_amax,
                               int64_t block_size, int64_t axis) {
  static auto op =
      detail::op_handle<decltype(fake_quantize_nvfp4)>("mqbench::fake_quantize_nvfp4");
  return op.call(x, global_amax, block_size, axis);
}

}  // namespace ops
}  // namespace mqbench
