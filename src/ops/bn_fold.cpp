// Fused BatchNorm folding for QAT convolutions in training mode: schema, validation, CPU
// implementation and C++ entry point. Autograd: autograd/bn_fold_kernel.cpp.
//
// Note [Fused BN folding]
// torch's ConvBn QAT modules (Krishnamoorthi 2018, "Quantizing deep convolutional networks for
// efficient inference", BN folding for training) compute, per output channel c with
// s = gamma / sqrt(running_var + eps):
//   x = conv(input, fake_quant(W * s), 0)      (the folded, quantized weight)
//   z = x / s + b                               (b: the conv bias, if any)
//   y = batch_norm(z) with batch statistics, updating the running ones;  optional ReLU
// as three full-size elementwise passes (div, add, BN) plus the ReLU, and as many again in
// backward. This op computes y from x in two passes (statistics, then y = x * A_c + B_c) and
// its gradients in two, with
//   mean_z = mean_x / s + b,  var_z = var_x / s^2,  zhat = (x - mean_x) * rstd / s,
//   rstd = 1 / sqrt(var_z + eps)
//   dz = gamma rstd (dy - mean(dy) - zhat mean(dy zhat)),   dx = dz / s
//   d_gamma = sum dy zhat,  d_beta = sum dy,  d_b = sum dz,  d_s = -sum dz x / s^2
// (dy after the ReLU's mask). The running statistics get torch's update:
//   running_mean += f (mean_z - running_mean),  running_var += f (var_z * m/(m-1) - running_var).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "mqbench/ops/bn_fold.h"
#include "ops/bn_fold_common.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/bn_fold_kernels.h"

namespace mqbench {
namespace ops {
namespace detail {

void update_bn_running_stats(at::Tensor& running_mean, at::Tensor& running_var,
                             const at::Tensor& mean_x, const at::Tensor& var_x,
                             const at::Tensor& s_f, const at::Tensor& b_f, int64_t m,
                             double factor) {
  if (!running_mean.defined() || !running_var.defined()) return;
  const auto s = s_f.to(at::kDouble);
  auto mean_z = mean_x / s;
  if (b_f.defined()) mean_z = mean_z + b_f.to(at::kDouble);
  const auto var_z = var_x / (s * s) * (static_cast<double>(m) / (m - 1));
  at::NoGradGuard no_grad;
  running_mean.mul_(1.0 - factor).add_(mean_z.to(running_mean.scalar_type()), factor);
  running_var.mul_(1.0 - factor).add_(var_z.to(running_var.scalar_type()), factor);
}

}  // namespace detail

namespace {

constexpr const char* kOp = "fold_bn_train";

struct Prepared {
  at::Tensor x, s, b, g, be;
  cpu::Layout layout;
  cpu::FoldParams params;
};

at::Tensor channel_param(const c10::optional<at::Tensor>& t, int64_t c, const char* name) {
  if (!t || !t->defined()) return at::Tensor();
  TORCH_CHECK(t->numel() == c, kOp, ": ", name, " has ", t->numel(), " elements but x has ", c,
              " channels");
  return t->detach().to(at::kFloat).contiguous().reshape({c});
}

Prepared prepare(const at::Tensor& x, const at::Tensor& scale_factor,
                 const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& weight,
                 const c10::optional<at::Tensor>& bn_bias, double eps, bool relu) {
  detail::check_input(x, kOp);
  TORCH_CHECK(x.scalar_type() == at::kFloat, kOp, ": x must be float32 (the QAT training path), "
              "got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 2, kOp, ": x must be [N, C, ...], got a ", x.dim(), "-d tensor");
  TORCH_CHECK(x.device().is_cpu(), kOp, ": x is on ", x.device(), "; CPU only");
  TORCH_CHECK(eps > 0, kOp, ": eps must be positive, got ", eps);
  Prepared p;
  p.x = x.contiguous();
  const int64_t c = x.size(1);
  p.s = channel_param(scale_factor, c, "scale_factor");
  TORCH_CHECK(p.s.defined(), kOp, ": scale_factor is required");
  p.b = channel_param(bias, c, "bias");
  p.g = channel_param(weight, c, "bn_weight");
  p.be = channel_param(bn_bias, c, "bn_bias");
  p.layout.outer = x.size(0);
  p.layout.channels = c;
  p.layout.inner = c == 0 || x.size(0) == 0 ? 0 : x.numel() / (x.size(0) * c);
  p.params = {p.s.data_ptr<float>(), p.b.defined() ? p.b.data_ptr<float>() : nullptr,
              p.g.defined() ? p.g.data_ptr<float>() : nullptr,
              p.be.defined() ? p.be.data_ptr<float>() : nullptr, eps, relu};
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fold_bn_train_cpu(
    const at::Tensor& x, const at::Tensor& scale_factor, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& bn_weight, const c10::optional<at::Tensor>& bn_bias,
    at::Tensor& running_mean, at::Tensor& running_var, double factor, double eps, bool relu) {
  auto p = prepare(x, scale_factor, bias, bn_weight, bn_bias, eps, relu);
  const int64_t c = p.layout.channels;
  const int64_t m = p.layout.outer * p.layout.inner;
  TORCH_CHECK(m > 1, kOp, ": batch normalization needs more than one value per channel, got ", m);
  auto out = at::empty_like(p.x);
  auto opts = x.options().dtype(at::kDouble);
  auto mean_x = at::empty({c}, opts), var_x = at::empty({c}, opts), rstd = at::empty({c}, opts);
  cpu::bn_fold_fwd_stub.get()(p.x.data_ptr<float>(), out.data_ptr<float>(), p.layout, p.params,
                              mean_x.data_ptr<double>(), var_x.data_ptr<double>(),
                              rstd.data_ptr<double>());
  detail::update_bn_running_stats(running_mean, running_var, mean_x, var_x, p.s, p.b, m, factor);
  return {out, mean_x, rstd};
}

at::Tensor like(const std::vector<double>& v, const at::Tensor& x) {
  return at::tensor(v, x.options().dtype(at::kDouble)).to(at::kFloat);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fold_bn_train_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale_factor,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& bn_weight,
    const c10::optional<at::Tensor>& bn_bias, const at::Tensor& mean_x, const at::Tensor& rstd,
    bool relu) {
  auto p = prepare(x, scale_factor, bias, bn_weight, bn_bias, 1.0, relu);
  detail::check_grad(grad, x, kOp);
  const int64_t c = p.layout.channels;
  const auto g = grad.contiguous();
  auto dx = at::empty_like(p.x);
  std::vector<double> d_s(c), d_b(c), d_gamma(c), d_beta(c);
  const auto mx = mean_x.contiguous(), rs = rstd.contiguous();
  cpu::bn_fold_bwd_stub.get()(g.data_ptr<float>(), p.x.data_ptr<float>(), dx.data_ptr<float>(),
                              p.layout, p.params, mx.data_ptr<double>(), rs.data_ptr<double>(),
                              d_s.data(), d_b.data(), d_gamma.data(), d_beta.data());
  return {dx, like(d_s, x), like(d_b, x), like(d_gamma, x), like(d_beta, x)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fold_bn_train(Tensor x, Tensor scale_factor, Tensor? bias, Tensor? bn_weight, "
        "Tensor? bn_bias, Tensor(a!) running_mean, Tensor(b!) running_var, "
        "float exponential_average_factor, float eps, bool relu) -> (Tensor, Tensor, Tensor)");
  m.def("_fold_bn_train_backward(Tensor grad, Tensor x, Tensor scale_factor, Tensor? bias, "
        "Tensor? bn_weight, Tensor? bn_bias, Tensor mean_x, Tensor rstd, bool relu) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fold_bn_train", TORCH_FN(fold_bn_train_cpu));
  m.impl("_fold_bn_train_backward", TORCH_FN(fold_bn_train_backward_cpu));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fold_bn_train(
    const at::Tensor& x, const at::Tensor& scale_factor, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& bn_weight, const c10::optional<at::Tensor>& bn_bias,
    at::Tensor& running_mean, at::Tensor& running_var, double exponential_average_factor,
    double eps, bool relu) {
  static auto op = detail::op_handle<decltype(fold_bn_train)>("mqbench::fold_bn_train");
  return op.call(x, scale_factor, bias, bn_weight, bn_bias, running_mean, running_var,
                 exponential_average_factor, eps, relu);
}

}  // namespace ops
}  // namespace mqbench
