// Autograd for the AdaRound ops: gradient to alpha only, in soft mode (formulas:
// cpu/adaround_kernel.cpp). Hard rounding is a step function of alpha: no gradient.

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using T = const at::Tensor&;

class AdaRound : public torch::autograd::Function<AdaRound> {
 public:
  // ch_axis < -x.dim() marks the per-tensor op (any valid axis lies in [-dim, dim)).
  static at::Tensor forward(AutogradContext* ctx, T x, T scale, T zero_point, T alpha,
                            int64_t ch_axis, int64_t qmin, int64_t qmax, bool hard) {
    static auto per_tensor = detail::op_handle<at::Tensor(T, T, T, T, int64_t, int64_t, bool)>(
        "mqbench::fake_quantize_adaround_per_tensor");
    static auto per_channel =
        detail::op_handle<at::Tensor(T, T, T, T, int64_t, int64_t, int64_t, bool)>(
            "mqbench::fake_quantize_adaround_per_channel");
    ctx->save_for_backward({x, scale, zero_point, alpha});
    ctx->saved_data["ch_axis"] = ch_axis;
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["hard"] = hard;
    at::AutoDispatchBelowADInplaceOrView guard;
    if (is_per_tensor(x, ch_axis)) return per_tensor.call(x, scale, zero_point, alpha, qmin, qmax, hard);
    return per_channel.call(x, scale, zero_point, alpha, ch_axis, qmin, qmax, hard);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto per_tensor = detail::op_handle<at::Tensor(T, T, T, T, T, int64_t, int64_t)>(
        "mqbench::_fake_quantize_adaround_per_tensor_backward");
    static auto per_channel =
        detail::op_handle<at::Tensor(T, T, T, T, T, int64_t, int64_t, int64_t)>(
            "mqbench::_fake_quantize_adaround_per_channel_backward");
    const auto s = ctx->get_saved_variables();
    const int64_t ch_axis = ctx->saved_data["ch_axis"].toInt();
    const int64_t qmin = ctx->saved_data["qmin"].toInt();
    const int64_t qmax = ctx->saved_data["qmax"].toInt();
    at::Tensor d_alpha;
    if (!ctx->saved_data["hard"].toBool()) {
      d_alpha = is_per_tensor(s[0], ch_axis)
                    ? per_tensor.call(grads[0], s[0], s[1], s[2], s[3], qmin, qmax)
                    : per_channel.call(grads[0], s[0], s[1], s[2], s[3], ch_axis, qmin, qmax);
    } else {
      d_alpha = at::zeros_like(s[3]);
    }
    // x: zero gradient (floor), as in MQBench; scale/zero_point: buffers.
    return {at::zeros_like(s[0]), at::Tensor(), at::Tensor(), d_alpha, at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  static bool is_per_tensor(T x, int64_t ch_axis) { return ch_axis < -x.dim(); }
};

constexpr int64_t kPerTensor = std::numeric_limits<int64_t>::min();

at::Tensor per_tensor_autograd(T x, T scale, T zero_point, T alpha, int64_t qmin, int64_t qmax,
                               bool hard) {
  detail::check_devices("fake_quantize_adaround_per_tensor", x,
                        {{scale, "scale"}, {zero_point, "zero_point"}, {alpha, "alpha"}});
  return AdaRound::apply(x, scale, zero_point, alpha, kPerTensor, qmin, qmax, hard);
}

at::Tensor per_channel_autograd(T x, T scale, T zero_point, T alpha, int64_t ch_axis,
                                int64_t qmin, int64_t qmax, bool hard) {
  detail::check_devices("fake_quantize_adaround_per_channel", x,
                        {{scale, "scale"}, {zero_point, "zero_point"}, {alpha, "alpha"}});
  TORCH_CHECK(ch_axis >= -x.dim() && ch_axis < x.dim(), "fake_quantize_adaround_per_channel: ch_axis (",
              ch_axis, ") is out of range for a ", x.dim(), "-d input (valid: ", -x.dim(), " to ",
              x.dim() - 1, ")");
  return AdaRound::apply(x, scale, zero_point, alpha, ch_axis, qmin, qmax, hard);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_adaround_per_tensor", TORCH_FN(per_tensor_autograd));
  m.impl("fake_quantize_adaround_per_channel", TORCH_FN(per_channel_autograd));
}

}  // namespace ops
}  // namespace mqbench
