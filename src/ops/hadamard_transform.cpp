// The Walsh-Hadamard transform along the last axis (online rotations of LLM activations, as
// QuaRot's): schema, argument checks, the CPU op and the C++ entry point of
// include/mqbench/ops/hadamard.h. The transform: Note [Hadamard transform] in
// ops/common/hadamard_formula.h; kernels cpu/hadamard_kernel.cpp, cuda/hadamard_kernel.cu;
// autograd autograd/hadamard_kernel.cpp; fake kernel python/mqbench/_fake_kernels.py; ONNX export
// python/mqbench/onnx/llm_ops.py.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/hadamard.h"
#include "ops/common/checks.h"
#include "ops/common/hadamard_formula.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/hadamard_kernel.h"

namespace mqbench {
namespace cpu {

MQBENCH_DEFINE_STUB(hadamard_stub, hadamard_fn);

}  // namespace cpu

namespace ops {
namespace detail {

HadamardArgs prepare_hadamard(const at::Tensor& x, const c10::optional<at::Tensor>& had,
                              const char* op) {
  check_input_with_half(x, op);
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension (the transform runs "
              "along the last), got a 0-d tensor");
  HadamardArgs a;
  a.n = x.size(-1);
  const bool with_had = had.has_value() && had->defined();
  if (with_had) {
    const auto& h = *had;
    check_same_device(x, h, "had", op);
    TORCH_CHECK(h.dim() == 2 && h.size(0) == h.size(1), op,
                ": had must be a square [m, m] matrix, got shape ", h.sizes());
    TORCH_CHECK(at::isFloatingType(h.scalar_type()), op,
                ": had must be a floating-point matrix, got dtype ", h.scalar_type());
    a.m = h.size(0);
    TORCH_CHECK(a.m >= 1, op, ": had must be a square [m, m] matrix with m >= 1, got shape ",
                h.sizes());
  }
  if (a.n > 0) {
    const int64_t p = a.n / a.m;
    const bool pow2 = (p & (p - 1)) == 0;
    if (with_had) {
      TORCH_CHECK(a.n % a.m == 0, op, ": x.size(-1) (", a.n, ") must be m * 2^k for had of "
                  "size m = ", a.m, ", but ", a.n, " is not a multiple of ", a.m);
      TORCH_CHECK(pow2, op, ": x.size(-1) (", a.n, ") must be m * 2^k for had of size m = ", a.m,
                  ", but ", a.n, " / ", a.m, " = ", p, " is not a power of two");
    } else {
      TORCH_CHECK(pow2, op, ": x.size(-1) (", a.n, ") must be a power of two when had is None; "
                  "pass had = an [m, m] matrix for sizes m * 2^k");
    }
    a.p = p;
    a.rows = x.numel() / a.n;
  } else {
    a.p = 0;
  }
  a.x = x.contiguous();
  if (with_had) {
    const auto ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    a.had = had->detach().to(ct).contiguous();
  }
  return a;
}

namespace {

at::Tensor hadamard_cpu(const at::Tensor& x, const c10::optional<at::Tensor>& had,
                        double scale) {
  const auto a = prepare_hadamard(x, had, "hadamard_transform");
  auto out = empty_output_like(a.x);  // contiguous, as a.x
  if (a.rows > 0) cpu::hadamard_stub.get()(a.x, a.had, scale, out, a.m, a.p);
  return out;
}

}  // namespace
}  // namespace detail

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("hadamard_transform(Tensor x, Tensor? had=None, float scale=1.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("hadamard_transform", TORCH_FN(detail::hadamard_cpu));
}

// ---- C++ entry point -------------------------------------------------------------------------

at::Tensor hadamard_transform(const at::Tensor& x, const c10::optional<at::Tensor>& had,
                              double scale) {
  static auto op = detail::op_handle<at::Tensor(const at::Tensor&,
                                                const c10::optional<at::Tensor>&, double)>(
      "mqbench::hadamard_transform");
  return op.call(x, had, scale);
}

}  // namespace ops
}  // namespace mqbench
