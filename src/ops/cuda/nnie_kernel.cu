// CUDA kernel of NNIE's logarithmic fake quantization (forward; its autograd is the identity;
// schema and CPU op in ops/fake_quantize_nnie.cpp, CPU kernel cpu/nnie_kernel.cpp). Formula:
// ops/common/algorithm_formula.h.
//
// NNIE's data_max is read on the device (no host synchronisation): a negative, NaN or infinite
// data_max, which the CPU op rejects, gives NaN outputs here; 0 gives zeros as on the CPU.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kNnie = "fake_quantize_nnie";

template <typename C>
struct NnieOp {
  const double* data_max;
  using Params = detail::NnieScalars;
  __device__ Params params(int64_t) const { return detail::nnie_scalars(data_max[0]); }
  __device__ C operator()(C x, const Params& p) const {
    return static_cast<C>(detail::nnie_forward(static_cast<double>(x), p));
  }
};

at::Tensor nnie_cuda(const at::Tensor& x_in, const at::Tensor& data_max) {
  const auto guard = gpu::device_guard(kNnie, x_in, {{data_max, "data_max"}});
  detail::check_input_with_half(x_in, kNnie);
  const auto dmax = gpu::device_scalar_param(x_in, data_max, "data_max", kNnie);
  const auto x = gpu::dense(x_in);
  auto out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(),
                                  "mqbench_nnie_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<1>(NnieOp<C>{dmax.data_ptr<double>()}, gpu::layout_of(x, c10::nullopt),
                       x.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr),
                       out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) { m.impl("fake_quantize_nnie", TORCH_FN(nnie_cuda)); }

}  // namespace ops
}  // namespace mqbench
