#pragma once
// Input validation and qparam preparation shared by every op (see Note [Qparam iterators] in
// ops/cpu/loops.h). Each check raises c10::Error whose message names the argument, the value
// and what to change.

#include <ATen/core/Tensor.h>
#include <ATen/TensorIterator.h>
#include <c10/util/Optional.h>

namespace mqbench {
namespace ops {
namespace detail {

/// x must be float32 or float64 (half types raise a message that says to upcast).
void check_input(const at::Tensor& x, const char* op);

/// For the CUDA kernels: x is float32, float64, float16 or bfloat16 (they compute the half
/// types in float32) and strided.
void check_input_with_half(const at::Tensor& x, const char* op);

/// quant_min <= quant_max.
void check_quant_range(int64_t quant_min, int64_t quant_max, const char* op);

/// Wraps a possibly negative axis into [0, x.dim()) or raises.
int64_t wrap_channel_axis(int64_t ch_axis, const at::Tensor& x, const char* op);

/// `t` (named `name`) is on x's device.
void check_same_device(const at::Tensor& x, const at::Tensor& t, const char* name, const char* op);

/// Every tensor in `others` is on x's device. Autograd wrappers call this before re-dispatching,
/// so a mismatch gets this message rather than "no kernel for backend X".
void check_devices(const char* op, const at::Tensor& x,
                   std::initializer_list<std::pair<at::Tensor, const char*>> others);

/// Validates scale and zero_point for a per-tensor op (axis empty: one element each) or a
/// per-channel op (x.size(axis) elements each): devices, dtypes, sizes, and that every scale is
/// positive and finite. Returns float32 contiguous 1-d copies/views {scale_f, zero_point_f}.
std::pair<at::Tensor, at::Tensor> prepare_qparams(const at::Tensor& x, const at::Tensor& scale,
                                                  const at::Tensor& zero_point,
                                                  c10::optional<int64_t> axis, const char* op);

/// Validates a tensor parameter (alpha, data_max, ...) that must hold exactly one element that
/// is not NaN, on x's device, and returns its value.
double scalar_param(const at::Tensor& x, const at::Tensor& p, const char* name, const char* op);

/// `t` (named `name`, e.g. AdaRound's alpha) is defined and has x's shape, dtype and device.
void check_like_x(const at::Tensor& x, const at::Tensor& t, const char* name, const char* op);

/// An observer's eps: a one-element floating tensor holding a positive finite value (read on the
/// host).
double eps_value(const at::Tensor& eps, const char* op);

/// Two observer range tensors (min_val / max_val, cur_min / cur_max, mean / std): defined,
/// floating, with as many elements each.
void check_range_pair(const at::Tensor& a, const at::Tensor& b, const char* na, const char* nb,
                      const char* op);

/// grad has x's shape, dtype and device.
void check_grad(const at::Tensor& grad, const at::Tensor& x, const char* op);

/// Builds the iterator of Note [Qparam iterators]: (outputs..., inputs..., scale, zero_point),
/// with scale_f/zero_point_f broadcast along `axis` (per-channel) or everywhere (per-tensor).
at::TensorIterator make_qparam_iter(std::initializer_list<at::Tensor> outputs,
                                    std::initializer_list<at::Tensor> inputs,
                                    const at::Tensor& scale_f, const at::Tensor& zero_point_f,
                                    c10::optional<int64_t> axis);

/// at::empty_like(x) (memory format preserved) for a kernel's output. See
/// Note [Huge pages for large outputs].
at::Tensor empty_output_like(const at::Tensor& x);

/// Turns per-channel double sums into a tensor shaped and typed like `like`.
at::Tensor sums_like(const double* sums, const at::Tensor& like);

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
