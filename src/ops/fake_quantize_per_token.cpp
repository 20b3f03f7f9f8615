// Dynamic per-token fake quantization of activations (one scale, and zero point, per row of the
// last axis, from that row at every call): schema, argument checks, the CPU op and the C++ entry
// point of include/mqbench/ops/fake_quantize_ops.h. Formulas: Note [Per-token fake quantization]
// in ops/common/per_token_formula.h; kernels cpu/per_token_kernel.cpp, cuda/per_token_kernel.cu;
// autograd (straight-through) autograd/per_token_kernel.cpp; fake kernel
// python/mqbench/_fake_kernels.py; ONNX export python/mqbench/onnx/llm_ops.py.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/common/per_token_formula.h"
#include "ops/cpu/per_token_kernel.h"

namespace mqbench {
namespace cpu {

MQBENCH_DEFINE_STUB(per_token_stub, per_token_fn);

}  // namespace cpu

namespace ops {
namespace detail {

TokenConfig per_token_config(const at::Tensor& x, int64_t quant_min, int64_t quant_max,
                             bool symmetric, c10::string_view format, const char* op) {
  check_input_with_half(x, op);
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension (one scale per row of "
              "the last), got a 0-d tensor");
  TokenConfig c;
  if (format == "int") {
    c.format = TokenFormat::kInt;
  } else if (format == "fp8_e4m3") {
    c.format = TokenFormat::kE4M3;
  } else if (format == "fp8_e5m2") {
    c.format = TokenFormat::kE5M2;
  } else {
    TORCH_CHECK(false, op, ": format must be 'int', 'fp8_e4m3' or 'fp8_e5m2', got '",
                std::string(format), "'");
  }
  if (c.format == TokenFormat::kInt) {  // FP8 ignores the integer range (the format fixes it)
    check_quant_range(quant_min, quant_max, op);
    TORCH_CHECK(quant_min < quant_max, op, ": quant_min (", quant_min,
                ") must be < quant_max (", quant_max, ") to compute a scale");
    c.quant_min = quant_min;
    c.quant_max = quant_max;
    c.symmetric = symmetric;
    // MQBench's symmetric quint8: the middle of an unsigned range (128 for [0, 255])
    c.symmetric_zero_point = quant_min < 0 ? 0 : (quant_min + quant_max + 1) / 2;
  }
  return c;
}

namespace {

at::Tensor per_token_cpu(const at::Tensor& x, int64_t quant_min, int64_t quant_max,
                         bool symmetric, c10::string_view format) {
  const auto c = per_token_config(x, quant_min, quant_max, symmetric, format,
                                  "fake_quantize_per_token");
  const auto xc = x.contiguous();
  auto out = empty_output_like(xc);  // contiguous, as xc
  if (xc.numel() > 0) cpu::per_token_stub.get()(xc, out, c);
  return out;
}

}  // namespace
}  // namespace detail

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_per_token(Tensor x, int quant_min, int quant_max, bool symmetric, "
        "str format=\"int\") -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_per_token", TORCH_FN(detail::per_token_cpu));
}

// ---- C++ entry point -------------------------------------------------------------------------

at::Tensor fake_quantize_per_token(const at::Tensor& x, int64_t quant_min, int64_t quant_max,
                                   bool symmetric, c10::string_view format) {
  static auto op = detail::op_handle<at::Tensor(const at::Tensor&, int64_t, int64_t, bool,
                                                c10::string_view)>(
      "mqbench::fake_quantize_per_token");
  return op.call(x, quant_min, quant_max, symmetric, format);
}

}  // namespace ops
}  // namespace mqbench
