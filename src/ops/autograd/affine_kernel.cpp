// Autograd for the affine fake-quantize ops. Each forward re-dispatches below autograd to the
// device kernel; each backward calls the op's own `_..._backward` op.
//
// Note [Saving the input instead of a mask]
// torch's fake-quant ops write a bool mask in forward (9 bytes/element moved) and multiply by
// it in backward. We save x and recompute the mask in backward instead: forward then moves
// 8 bytes/element (the copy_ bound), and x is nearly always alive anyway (it is the output of
// the ReLU/conv that feeds the quantizer, or a weight). The learnable ops need x in backward
// regardless.

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using detail::op_handle;

using FixedTensorSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                  int64_t);
using FixedTensorBwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, int64_t, int64_t);
using FixedChannelSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   int64_t, int64_t, int64_t);
using FixedChannelBwdSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, int64_t, int64_t, int64_t);
using LearnTensorSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  int64_t, int64_t, double);
using Grads3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using LearnTensorBwdSig = Grads3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, int64_t, int64_t, double);
using LearnChannelSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   int64_t, int64_t, int64_t, double);
using LearnChannelBwdSig = Grads3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, int64_t, int64_t, int64_t, double);

class FixedPerTensor : public torch::autograd::Function<FixedPerTensor> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
    static auto op = op_handle<FixedTensorSig>("mqbench::fake_quantize_per_tensor_affine");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, qmin, qmax);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op =
        op_handle<FixedTensorBwdSig>("mqbench::_fake_quantize_per_tensor_affine_backward");
    const auto s = ctx->get_saved_variables();
    auto dx = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["qmin"].toInt(),
                      ctx->saved_data["qmax"].toInt());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class FixedPerChannel : public torch::autograd::Function<FixedPerChannel> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                            int64_t qmax) {
    static auto op = op_handle<FixedChannelSig>("mqbench::fake_quantize_per_channel_affine");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["ch_axis"] = ch_axis;
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, ch_axis, qmin, qmax);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op =
        op_handle<FixedChannelBwdSig>("mqbench::_fake_quantize_per_channel_affine_backward");
    const auto s = ctx->get_saved_variables();
    auto dx = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["ch_axis"].toInt(),
                      ctx->saved_data["qmin"].toInt(), ctx->saved_data["qmax"].toInt());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class LearnablePerTensor : public torch::autograd::Function<LearnablePerTensor> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                            double grad_factor) {
    static auto op =
        op_handle<LearnTensorSig>("mqbench::fake_quantize_learnable_per_tensor_affine");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["grad_factor"] = grad_factor;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, qmin, qmax, grad_factor);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op = op_handle<LearnTensorBwdSig>(
        "mqbench::_fake_quantize_learnable_per_tensor_affine_backward");
    const auto s = ctx->get_saved_variables();
    auto g = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["qmin"].toInt(),
                     ctx->saved_data["qmax"].toInt(), ctx->saved_data["grad_factor"].toDouble());
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

class LearnablePerChannel : public torch::autograd::Function<LearnablePerChannel> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                            int64_t qmax, double grad_factor) {
    static auto op =
        op_handle<LearnChannelSig>("mqbench::fake_quantize_learnable_per_channel_affine");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["ch_axis"] = ch_axis;
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["grad_factor"] = grad_factor;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, ch_axis, qmin, qmax, grad_factor);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op = op_handle<LearnChannelBwdSig>(
        "mqbench::_fake_quantize_learnable_per_channel_affine_backward");
    const auto s = ctx->get_saved_variables();
    auto g = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["ch_axis"].toInt(),
                     ctx->saved_data["qmin"].toInt(), ctx->saved_data["qmax"].toInt(),
                     ctx->saved_data["grad_factor"].toDouble());
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

at::Tensor per_tensor_autograd(const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
  detail::check_devices("fake_quantize_per_tensor_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return FixedPerTensor::apply(x, scale, zero_point, qmin, qmax);
}

at::Tensor per_channel_autograd(const at::Tensor& x, const at::Tensor& scale,
                                const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                                int64_t qmax) {
  detail::check_devices("fake_quantize_per_channel_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return FixedPerChannel::apply(x, scale, zero_point, ch_axis, qmin, qmax);
}

at::Tensor learnable_per_tensor_autograd(const at::Tensor& x, const at::Tensor& scale,
                                         const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                                         double grad_factor) {
  detail::check_devices("fake_quantize_learnable_per_tensor_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return LearnablePerTensor::apply(x, scale, zero_point, qmin, qmax, grad_factor);
}

at::Tensor learnable_per_channel_autograd(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t ch_axis,
                                          int64_t qmin, int64_t qmax, double grad_factor) {
  detail::check_devices("fake_quantize_learnable_per_channel_affine", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return LearnablePerChannel::apply(x, scale, zero_point, ch_axis, qmin, qmax, grad_factor);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_per_tensor_affine", TORCH_FN(per_tensor_autograd));
  m.impl("fake_quantize_per_channel_affine", TORCH_FN(per_channel_autograd));
  m.impl("fake_quantize_learnable_per_tensor_affine", TORCH_FN(learnable_per_tensor_autograd));
  m.impl("fake_quantize_learnable_per_channel_affine", TORCH_FN(learnable_per_channel_autograd));
}

}  // namespace ops
}  // namespace mqbench
