#pragma once
// One autograd Function for the fake-quantize ops whose backward is an op of its own (the
// torchvision pattern: `op` and `_op_backward`), so each autograd/<family>_kernel.cpp says only
// which ops and which inputs get a gradient.
//
// Note [Backward op arguments]
// The backward op of `mqbench::<op>(a0, ..., an)` is `mqbench::_<op>_backward(grad, a0, ...,
// an)`: the upstream gradient, then the forward's arguments unchanged. It returns the
// gradients of the first k arguments (one Tensor, or a tuple of k); the other arguments get
// none. Forward saves the tensor arguments with save_for_backward (x, not a mask: Note [Saving
// the input instead of a mask] in affine_kernel.cpp) and the others in saved_data, and
// re-dispatches below autograd to the device kernel.

#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace detail {

/// Names an op pair; BackwardResult is at::Tensor or std::tuple<at::Tensor, ...>. A null
/// kBackward gives the identity gradient to the first argument (straight-through ops whose
/// backward needs no kernel).
template <const char* kForward, const char* kBackward, typename BackwardResult>
struct OpPair {
  static constexpr const char* forward_name = kForward;
  static constexpr const char* backward_name = kBackward;
  using Result = BackwardResult;
};

template <typename A>
constexpr bool kIsTensorArg = std::is_same_v<std::decay_t<A>, at::Tensor>;

template <typename Pair, typename... Args>
class OpFunction : public torch::autograd::Function<OpFunction<Pair, Args...>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, Args... args) {
    static auto op = op_handle<at::Tensor(Args...)>(Pair::forward_name);
    if constexpr (Pair::backward_name != nullptr) {
      save(ctx, std::index_sequence_for<Args...>{}, args...);
    }
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(args...);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(sizeof...(Args));
    if constexpr (Pair::backward_name == nullptr) {
      out[0] = grads[0];
    } else {
      static auto op =
          op_handle<typename Pair::Result(const at::Tensor&, Args...)>(Pair::backward_name);
      const auto saved = ctx->get_saved_variables();
      auto result = call_saved(op, grads[0], ctx, saved, std::index_sequence_for<Args...>{});
      if constexpr (std::is_same_v<typename Pair::Result, at::Tensor>) {
        out[0] = std::move(result);
      } else {
        std::apply([&](auto&... g) {
          size_t i = 0;
          ((out[i++] = std::move(g)), ...);
        }, result);
      }
    }
    return out;
  }

 private:
  // The position of argument I among the tensor arguments (its index in the saved variables).
  template <size_t I>
  static constexpr size_t tensor_slot() {
    constexpr bool is_tensor[] = {kIsTensorArg<Args>...};
    size_t n = 0;
    for (size_t i = 0; i < I; ++i) n += is_tensor[i] ? 1 : 0;
    return n;
  }

  static std::string key(size_t i) { return "arg" + std::to_string(i); }

  template <size_t... I>
  static void save(torch::autograd::AutogradContext* ctx, std::index_sequence<I...>,
                   Args... args) {
    torch::autograd::variable_list tensors;
    auto keep = [&](size_t i, const auto& a) {
      if constexpr (kIsTensorArg<decltype(a)>) {
        tensors.push_back(a);
      } else {
        ctx->saved_data[key(i)] = a;
      }
    };
    (keep(I, args), ...);
    ctx->save_for_backward(tensors);
  }

  template <size_t I>
  static auto saved_arg(torch::autograd::AutogradContext* ctx,
                        const torch::autograd::variable_list& saved) {
    using A = std::decay_t<std::tuple_element_t<I, std::tuple<Args...>>>;
    if constexpr (kIsTensorArg<A>) {
      return saved[tensor_slot<I>()];
    } else {
      return ctx->saved_data[key(I)].template to<A>();
    }
  }

  template <typename Op, size_t... I>
  static auto call_saved(const Op& op, const at::Tensor& grad,
                         torch::autograd::AutogradContext* ctx,
                         const torch::autograd::variable_list& saved, std::index_sequence<I...>) {
    return op.call(grad, saved_arg<I>(ctx, saved)...);
  }
};

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
