// CUDA kernels of PACT (learned clipping; schema and CPU op in ops/fake_quantize_pact.cpp, CPU
// kernel cpu/pact_kernel.cpp). Formulas: ops/common/algorithm_formula.h; the reductions of the
// clip gradients are deterministic (launch.cuh).
//
// PACT's alpha and n_alpha are read on the device: no host synchronisation, so the CPU op's
// check n_alpha <= alpha is not made here (with n_alpha > alpha every element clips to alpha).

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kPact = "fake_quantize_pact";

template <typename C>
struct PactParams {
  detail::AffineScalars<C> a;
  C lower, upper;
};

template <typename C>
struct PactBase {
  const float* scale;
  const float* zero_point;
  const double* upper;  // alpha
  const double* lower;  // n_alpha
  long long qmin, qmax;
  using Params = PactParams<C>;
  __device__ Params params(int64_t) const {
    return {detail::affine_scalars<C>(scale[0], zero_point[0], qmin, qmax),
            static_cast<C>(lower[0]), static_cast<C>(upper[0])};
  }
};

template <typename C>
struct PactForward : PactBase<C> {
  __device__ C operator()(C x, const PactParams<C>& p) const {
    return detail::pact_forward(x, p.lower, p.upper, p.a);
  }
};

template <typename T>
struct PactBackward : PactBase<gpu::compute_t<T>> {
  using C = gpu::compute_t<T>;
  const T* dy;
  const T* x;
  T* dx;
  __device__ void operator()(int64_t i, const PactParams<C>& p, gpu::Sum2& acc) const {
    C d_upper, d_lower;
    dx[i] = static_cast<T>(detail::pact_grad(static_cast<C>(dy[i]), static_cast<C>(x[i]),
                                             p.lower, p.upper, p.a, d_upper, d_lower));
    acc.a += static_cast<double>(d_upper);
    acc.b += static_cast<double>(d_lower);
  }
};

struct PactPrepared {
  gpu::Prepared pr;
  at::Tensor upper, lower;  // float64 [1] on the device
};

PactPrepared prepare_pact(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& n_alpha,
                          const at::Tensor& scale, const at::Tensor& zero_point, int64_t qmin,
                          int64_t qmax) {
  PactPrepared r;
  r.pr = gpu::prepare(kPact, x, scale, zero_point, c10::nullopt, qmin, qmax);
  r.upper = gpu::device_scalar_param(x, alpha, "alpha", kPact);
  r.lower = gpu::device_scalar_param(x, n_alpha, "n_alpha", kPact);
  return r;
}

at::Tensor pact_cuda(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& n_alpha,
                     const at::Tensor& scale, const at::Tensor& zero_point, int64_t qmin,
                     int64_t qmax) {
  const auto guard = gpu::device_guard(kPact, x, {{alpha, "alpha"}, {n_alpha, "n_alpha"},
                                                  {scale, "scale"}, {zero_point, "zero_point"}});
  const auto a = prepare_pact(x, alpha, n_alpha, scale, zero_point, qmin, qmax);
  auto out = at::empty_like(a.pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.pr.x.scalar_type(),
                                  "mqbench_pact_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    PactForward<C> k;
    static_cast<PactBase<C>&>(k) = {a.pr.scale(), a.pr.zero_point(), a.upper.data_ptr<double>(),
                                    a.lower.data_ptr<double>(), qmin, qmax};
    gpu::launch_map<1>(k, a.pr.layout, a.pr.x.data_ptr<scalar_t>(),
                       static_cast<const scalar_t*>(nullptr), out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pact_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& alpha,
    const at::Tensor& n_alpha, const at::Tensor& scale, const at::Tensor& zero_point,
    int64_t qmin, int64_t qmax) {
  const auto guard = gpu::device_guard(
      kPact, x, {{grad, "grad"}, {alpha, "alpha"}, {n_alpha, "n_alpha"}, {scale, "scale"},
                 {zero_point, "zero_point"}});
  const auto a = prepare_pact(x, alpha, n_alpha, scale, zero_point, qmin, qmax);
  const auto dy = gpu::prepare_grad(kPact, grad, x, a.pr);
  auto dx = at::empty_like(a.pr.x);
  auto d_upper = gpu::sum_buffer(1, a.pr.x);
  auto d_lower = gpu::sum_buffer(1, a.pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.pr.x.scalar_type(),
                                  "mqbench_pact_bwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    PactBackward<scalar_t> k;
    static_cast<PactBase<C>&>(k) = {a.pr.scale(), a.pr.zero_point(), a.upper.data_ptr<double>(),
                                    a.lower.data_ptr<double>(), qmin, qmax};
    k.dy = dy.data_ptr<scalar_t>();
    k.x = a.pr.x.data_ptr<scalar_t>();
    k.dx = dx.data_ptr<scalar_t>();
    gpu::launch_reduce<gpu::Sum2>(
        k, a.pr.layout, a.pr.x,
        gpu::StoreSum2{d_upper.data_ptr<double>(), d_lower.data_ptr<double>()});
  });
  return {dx, gpu::sums_as(d_upper, alpha), gpu::sums_as(d_lower, n_alpha)};
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_pact", TORCH_FN(pact_cuda));
  m.impl("_fake_quantize_pact_backward", TORCH_FN(pact_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
