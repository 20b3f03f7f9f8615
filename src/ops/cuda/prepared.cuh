#pragma once
// The host-side preparation every quantizing CUDA op shares: input checks, the wrapped channel
// axis, the float32 scale / zero point on the device (prepare_qparams reads values only of CPU
// tensors: no host synchronisation) and the dense layout of x (Note [CUDA dense layout]).

#include "ops/common/checks.h"
#include "ops/cuda/launch.cuh"

namespace mqbench {
namespace ops {
namespace gpu {

struct Prepared {
  at::Tensor x;  // dense
  c10::optional<int64_t> axis;
  std::pair<at::Tensor, at::Tensor> qp;  // float32 scale and zero point, on the device
  Layout layout;
  const float* scale() const { return qp.first.data_ptr<float>(); }
  const float* zero_point() const { return qp.second.data_ptr<float>(); }
};

inline Prepared prepare(const char* op, const at::Tensor& x, const at::Tensor& scale,
                        const at::Tensor& zero_point, c10::optional<int64_t> ch_axis,
                        int64_t qmin, int64_t qmax) {
  detail::check_input_with_half(x, op);
  detail::check_quant_range(qmin, qmax, op);
  Prepared r;
  if (ch_axis) r.axis = detail::wrap_channel_axis(*ch_axis, x, op);
  r.qp = detail::prepare_qparams(x, scale, zero_point, r.axis, op);
  r.x = dense(x);
  r.layout = layout_of(r.x, r.axis);
  return r;
}

/// The incoming gradient checked against x and laid out with the dense x's strides.
inline at::Tensor prepare_grad(const char* op, const at::Tensor& grad, const at::Tensor& x,
                               const Prepared& pr) {
  detail::check_grad(grad, x, op);
  return with_strides_of(grad, pr.x);
}

}  // namespace gpu
}  // namespace ops
}  // namespace mqbench
