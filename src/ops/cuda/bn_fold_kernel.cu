// CUDA kernels of the fused BatchNorm folding of QAT ConvBn modules in training mode
// (fold_bn_train and its backward; schema, mathematics and the CPU kernels in ops/bn_fold.cpp,
// Note [Fused BN folding]). Two passes forward (per-channel statistics, then y = x * A_c + B_c
// with the optional ReLU) and two backward, each a deterministic per-channel reduction of
// launch.cuh fused with the elementwise pass; x may be in any dense memory format
// (channels_last included). float16 / bfloat16 x (autocast) computes in float32.

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/bn_fold_common.h"
#include "ops/common/checks.h"
#include "ops/cuda/launch.cuh"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kOp = "fold_bn_train";

/// Per-channel float parameters on the device (nullptr when absent: gamma 1, beta 0, bias 0).
struct ChannelParams {
  const float* s;
  const float* b;
  const float* gamma;
  const float* beta;
};

struct Prepared {
  at::Tensor x, s, b, g, be;
  gpu::Layout layout;
  int64_t shift_stride = 0;  // offset of channel c's first element: c * shift_stride
  int64_t m = 0;             // elements per channel
  ChannelParams params() const {
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; };
    return {ptr(s), ptr(b), ptr(g), ptr(be)};
  }
};

at::Tensor channel_param(const at::Tensor& x, const c10::optional<at::Tensor>& t, int64_t c,
                         const char* name) {
  if (!t || !t->defined()) return at::Tensor();
  TORCH_CHECK(t->numel() == c, kOp, ": ", name, " has ", t->numel(), " elements but x has ", c,
              " channels");
  detail::check_same_device(x, *t, name, kOp);
  return t->detach().to(at::kFloat).contiguous().reshape({c});
}

Prepared prepare(const at::Tensor& x, const at::Tensor& scale_factor,
                 const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& weight,
                 const c10::optional<at::Tensor>& bn_bias, double eps) {
  detail::check_input_with_half(x, kOp);
  TORCH_CHECK(x.scalar_type() != at::kDouble, kOp, ": x must be float32, float16 or bfloat16 "
              "(the QAT training path), got float64");
  TORCH_CHECK(x.dim() >= 2, kOp, ": x must be [N, C, ...], got a ", x.dim(), "-d tensor");
  TORCH_CHECK(eps > 0, kOp, ": eps must be positive, got ", eps);
  Prepared p;
  p.x = gpu::dense(x);
  const int64_t c = x.size(1);
  p.s = channel_param(x, scale_factor, c, "scale_factor");
  TORCH_CHECK(p.s.defined(), kOp, ": scale_factor is required");
  p.b = channel_param(x, bias, c, "bias");
  p.g = channel_param(x, weight, c, "bn_weight");
  p.be = channel_param(x, bn_bias, c, "bn_bias");
  p.layout = gpu::layout_of(p.x, int64_t(1));
  p.shift_stride = c > 1 ? p.layout.inner : 0;
  p.m = c == 0 ? 0 : p.x.numel() / c;
  return p;
}

// ---- forward -------------------------------------------------------------------------------------

template <typename T>
struct StatsOp {
  const T* x;
  int64_t shift_stride;
  struct Params {
    double shift;
  };
  __device__ Params params(int64_t c) const {
    return {static_cast<double>(static_cast<float>(x[c * shift_stride]))};
  }
  __device__ void operator()(int64_t i, const Params& p, gpu::Sum2& acc) const {
    const double d = static_cast<double>(static_cast<float>(x[i])) - p.shift;
    acc.a += d;
    acc.b += d * d;
  }
};

template <typename T>
struct StatsFin {
  const T* x;
  int64_t shift_stride;
  ChannelParams cp;
  double m, eps;
  double *mean_x, *var_x, *rstd;
  float* coef;  // [C, 2]: y = x * coef[2c] + coef[2c + 1]
  __device__ void operator()(int64_t c, const gpu::Sum2& sums) const {
    const double shift = static_cast<float>(x[c * shift_stride]);
    const double md = m > 0 ? sums.a / m : 0.0;
    const double v = m > 0 ? sums.b / m - md * md : 0.0;
    const double var = v > 0.0 ? v : 0.0;
    const double s = cp.s[c];
    mean_x[c] = shift + md;
    var_x[c] = var;
    rstd[c] = 1.0 / ::sqrt(var / (s * s) + eps);
    const double g = cp.gamma ? cp.gamma[c] : 1.0;
    const double be = cp.beta ? cp.beta[c] : 0.0;
    coef[2 * c] = static_cast<float>(g * rstd[c] / s);
    coef[2 * c + 1] = static_cast<float>(be - g * rstd[c] * mean_x[c] / s);
  }
};

struct ApplyOp {
  const float* coef;
  bool relu;
  struct Params {
    float a, c;
  };
  __device__ Params params(int64_t c) const { return {coef[2 * c], coef[2 * c + 1]}; }
  __device__ float operator()(float x, const Params& p) const {
    const float y = x * p.a + p.c;
    return relu ? (y < 0.f ? 0.f : y) : y;
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> fold_bn_train_cuda(
    const at::Tensor& x, const at::Tensor& scale_factor, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& bn_weight, const c10::optional<at::Tensor>& bn_bias,
    at::Tensor& running_mean, at::Tensor& running_var, double factor, double eps, bool relu) {
  const auto guard = gpu::device_guard(
      kOp, x, {{scale_factor, "scale_factor"}, {bias.value_or(at::Tensor()), "bias"},
               {bn_weight.value_or(at::Tensor()), "bn_weight"},
               {bn_bias.value_or(at::Tensor()), "bn_bias"}, {running_mean, "running_mean"},
               {running_var, "running_var"}});
  auto p = prepare(x, scale_factor, bias, bn_weight, bn_bias, eps);
  const int64_t c = x.size(1);
  TORCH_CHECK(p.m > 1, kOp, ": batch normalization needs more than one value per channel, got ",
              p.m);
  auto out = at::empty_like(p.x);
  auto opts = x.options().dtype(at::kDouble);
  auto mean_x = at::empty({c}, opts), var_x = at::empty({c}, opts), rstd = at::empty({c}, opts);
  auto coef = at::empty({c, 2}, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.x.scalar_type(),
                                  "mqbench_fold_bn_fwd_cuda", [&] {
    const scalar_t* xp = p.x.data_ptr<scalar_t>();
    gpu::launch_reduce<gpu::Sum2>(
        StatsOp<scalar_t>{xp, p.shift_stride}, p.layout, p.x,
        StatsFin<scalar_t>{xp, p.shift_stride, p.params(), static_cast<double>(p.m), eps,
                           mean_x.data_ptr<double>(), var_x.data_ptr<double>(),
                           rstd.data_ptr<double>(), coef.data_ptr<float>()});
    gpu::launch_map<1>(ApplyOp{coef.data_ptr<float>(), relu}, p.layout, xp,
                       static_cast<const scalar_t*>(nullptr), out.data_ptr<scalar_t>());
  });
  detail::update_bn_running_stats(running_mean, running_var, mean_x, var_x, p.s, p.b, p.m,
                                  factor);
  return {out, mean_x, rstd};
}

// ---- backward ------------------------------------------------------------------------------------

/// Per-channel constants of the backward passes (Note [Fused BN folding]).
struct BwdParams {
  float a, c;    // forward coefficients (the ReLU mask)
  float zr, zm;  // zhat = (x - zm) * zr
  float f_dy, f_p, f_q;
};

struct BwdConsts {
  ChannelParams cp;
  const double* mean_x;
  const double* rstd;
  const float* second;  // [C, 3]: f_dy, f_p, f_q (after the first pass)
  bool relu;
  __device__ BwdParams params(int64_t c) const {
    const double s = cp.s[c];
    const double g = cp.gamma ? cp.gamma[c] : 1.0;
    const double be = cp.beta ? cp.beta[c] : 0.0;
    BwdParams p;
    p.a = static_cast<float>(g * rstd[c] / s);
    p.c = static_cast<float>(be - g * rstd[c] * mean_x[c] / s);
    p.zr = static_cast<float>(rstd[c] / s);
    p.zm = static_cast<float>(mean_x[c]);
    p.f_dy = second ? second[3 * c] : 0.f;
    p.f_p = second ? second[3 * c + 1] : 0.f;
    p.f_q = second ? second[3 * c + 2] : 0.f;
    return p;
  }
  __device__ float masked(float dy, float x, const BwdParams& p) const {
    return (relu && !(x * p.a + p.c > 0.f)) ? 0.f : dy;
  }
};

template <typename T>
struct BwdPass1 : BwdConsts {
  using Params = BwdParams;
  const T* dout;
  const T* x;
  __device__ void operator()(int64_t i, const BwdParams& p, gpu::Sum2& acc) const {
    const float xv = static_cast<float>(x[i]);
    const double dy = masked(static_cast<float>(dout[i]), xv, p);
    acc.a += dy;
    acc.b += dy * static_cast<double>((xv - p.zm) * p.zr);
  }
};

struct BwdFin1 {
  BwdConsts k;
  double m;
  double *d_gamma, *d_beta;
  float* second;
  __device__ void operator()(int64_t c, const gpu::Sum2& s1) const {
    d_beta[c] = s1.a;
    d_gamma[c] = s1.b;
    const double g = k.cp.gamma ? k.cp.gamma[c] : 1.0;
    const double gr = g * k.rstd[c];
    second[3 * c] = static_cast<float>(gr / k.cp.s[c]);
    second[3 * c + 1] = static_cast<float>(s1.a / m);
    second[3 * c + 2] = static_cast<float>(s1.b / m);
  }
};

template <typename T>
struct BwdPass2 : BwdConsts {
  using Params = BwdParams;
  const T* dout;
  const T* x;
  T* dx;
  __device__ void operator()(int64_t i, const BwdParams& p, gpu::Sum2& acc) const {
    const float xv = static_cast<float>(x[i]);
    const float t = masked(static_cast<float>(dout[i]), xv, p) - p.f_p - ((xv - p.zm) * p.zr) * p.f_q;
    dx[i] = static_cast<T>(t * p.f_dy);
    acc.a += static_cast<double>(t);
    acc.b += static_cast<double>(t) * xv;
  }
};

struct BwdFin2 {
  BwdConsts k;
  double *d_s, *d_b;
  __device__ void operator()(int64_t c, const gpu::Sum2& s2) const {
    const double s = k.cp.s[c];
    const double g = k.cp.gamma ? k.cp.gamma[c] : 1.0;
    const double gr = g * k.rstd[c];
    d_b[c] = gr * s2.a;
    d_s[c] = -gr * s2.b / (s * s);
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fold_bn_train_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale_factor,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& bn_weight,
    const c10::optional<at::Tensor>& bn_bias, const at::Tensor& mean_x, const at::Tensor& rstd,
    bool relu) {
  const auto guard = gpu::device_guard(
      kOp, x, {{grad, "grad"}, {scale_factor, "scale_factor"},
               {bias.value_or(at::Tensor()), "bias"}, {bn_weight.value_or(at::Tensor()), "bn_weight"},
               {bn_bias.value_or(at::Tensor()), "bn_bias"}, {mean_x, "mean_x"}, {rstd, "rstd"}});
  auto p = prepare(x, scale_factor, bias, bn_weight, bn_bias, 1.0);
  detail::check_grad(grad, x, kOp);
  const int64_t c = x.size(1);
  TORCH_CHECK(mean_x.numel() == c && rstd.numel() == c, kOp,
              ": mean_x and rstd must hold one value per channel (", c, ")");
  const auto g = gpu::with_strides_of(grad, p.x);
  const auto mx = mean_x.to(at::kDouble).contiguous(), rs = rstd.to(at::kDouble).contiguous();
  auto dx = at::empty_like(p.x);
  auto opts = x.options().dtype(at::kDouble);
  auto d_s = at::empty({c}, opts), d_b = at::empty({c}, opts), d_gamma = at::empty({c}, opts),
       d_beta = at::empty({c}, opts);
  auto second = at::empty({c, 3}, x.options().dtype(at::kFloat));
  BwdConsts k{p.params(), mx.data_ptr<double>(), rs.data_ptr<double>(), nullptr, relu};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.x.scalar_type(),
                                  "mqbench_fold_bn_bwd_cuda", [&] {
    BwdPass1<scalar_t> pass1;
    static_cast<BwdConsts&>(pass1) = k;
    pass1.dout = g.data_ptr<scalar_t>();
    pass1.x = p.x.data_ptr<scalar_t>();
    gpu::launch_reduce<gpu::Sum2>(
        pass1, p.layout, p.x,
        BwdFin1{k, static_cast<double>(p.m), d_gamma.data_ptr<double>(),
                d_beta.data_ptr<double>(), second.data_ptr<float>()});
    BwdConsts k2 = k;
    k2.second = second.data_ptr<float>();
    BwdPass2<scalar_t> pass2;
    static_cast<BwdConsts&>(pass2) = k2;
    pass2.dout = g.data_ptr<scalar_t>();
    pass2.x = p.x.data_ptr<scalar_t>();
    pass2.dx = dx.data_ptr<scalar_t>();
    gpu::launch_reduce<gpu::Sum2>(pass2, p.layout, p.x,
                                  BwdFin2{k2, d_s.data_ptr<double>(), d_b.data_ptr<double>()});
  });
  auto as_float = [](const at::Tensor& t) { return t.to(at::kFloat); };
  return {dx, as_float(d_s), as_float(d_b), as_float(d_gamma), as_float(d_beta)};
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fold_bn_train", TORCH_FN(fold_bn_train_cuda));
  m.impl("_fold_bn_train_backward", TORCH_FN(fold_bn_train_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
