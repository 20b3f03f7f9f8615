// Group-wise integer fake quantization (INT4 / INT8 weights with one scale and zero point per
// `group_size` consecutive elements along an axis, the input channels of a weight): schemas and
// the C++ entry points of include/mqbench/ops/fake_quantize_ops.h.
//
// Note [Group-wise ops are per-channel ops on a view]
// Moving the grouped axis last and viewing x as [rows, group_size] turns every group into a
// row: the group-wise op is then exactly the per-channel affine op along axis 0 of that view, with
// the scale laid out in the same order (x.shape with size(axis) / group_size at `axis`, moved
// the same way). So the ops are CompositeImplicitAutograd: their CPU, CUDA and fake kernels and
// their gradients (STE; LSQ / LSQ+ for the learnable one, reduced per group) are those of
// fake_quantize_(learnable_)per_channel_affine, written once (cpu/affine_kernel.cpp,
// cuda/affine_kernel.cu). For a 2-d weight grouped along its last axis (Linear) the view costs
// nothing; a Conv weight [out, in, kh, kw] grouped along axis 1 is copied once (weights are small).

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

struct GroupView {
  int64_t axis;
  at::Tensor x_rows;               // [rows, group_size]
  at::Tensor scale, zero_point;    // [rows]
  std::vector<int64_t> moved_shape;  // x.movedim(axis, -1).sizes()
};

GroupView group_view(const char* op, const at::Tensor& x, const at::Tensor& scale,
                     const at::Tensor& zero_point, int64_t axis, int64_t group_size) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, op, ": x must be a tensor with at least one dimension");
  GroupView v;
  v.axis = detail::wrap_channel_axis(axis, x, op);
  const int64_t n = x.size(v.axis);
  TORCH_CHECK(group_size >= 1, op, ": group_size must be >= 1, got ", group_size);
  TORCH_CHECK(n % group_size == 0, op, ": group_size (", group_size, ") must divide x.size(",
              v.axis, ") = ", n);
  auto shape = x.sizes().vec();
  shape[v.axis] = n / group_size;
  const int64_t groups = c10::multiply_integers(shape);
  TORCH_CHECK(scale.defined() && zero_point.defined(), op,
              ": scale and zero_point must be defined tensors");
  TORCH_CHECK(scale.numel() == groups && zero_point.numel() == groups, op, ": scale and "
              "zero_point must have one element per group: x.shape with size(", v.axis,
              ") / group_size, i.e. ", c10::IntArrayRef(shape), " (", groups,
              " elements), got shapes ", scale.sizes(), " and ", zero_point.sizes());
  const auto moved = x.movedim(v.axis, -1);
  v.moved_shape = moved.sizes().vec();
  v.x_rows = moved.reshape({-1, group_size});
  v.scale = scale.reshape(shape).movedim(v.axis, -1).reshape({-1});
  v.zero_point = zero_point.reshape(shape).movedim(v.axis, -1).reshape({-1});
  return v;
}

at::Tensor from_rows(const GroupView& v, const at::Tensor& rows) {
  return rows.reshape(v.moved_shape).movedim(-1, v.axis);
}

at::Tensor per_group(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                     int64_t axis, int64_t group_size, int64_t qmin, int64_t qmax) {
  const auto v = group_view("fake_quantize_per_group_affine", x, scale, zero_point, axis,
                            group_size);
  return from_rows(v, ops::fake_quantize_per_channel_affine(v.x_rows, v.scale, v.zero_point, 0, qmin,
                                                       qmax));
}

at::Tensor learnable_per_group(const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& zero_point, int64_t axis, int64_t group_size,
                               int64_t qmin, int64_t qmax, double grad_factor) {
  const auto v = group_view("fake_quantize_learnable_per_group_affine", x, scale, zero_point,
                            axis, group_size);
  return from_rows(v, ops::fake_quantize_learnable_per_channel_affine(
                          v.x_rows, v.scale, v.zero_point, 0, qmin, qmax, grad_factor));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_per_group_affine(Tensor x, Tensor scale, Tensor zero_point, int axis, "
        "int group_size, int quant_min, int quant_max) -> Tensor");
  m.def("fake_quantize_learnable_per_group_affine(Tensor x, Tensor scale, Tensor zero_point, "
        "int axis, int group_size, int quant_min, int quant_max, float grad_factor) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("fake_quantize_per_group_affine", TORCH_FN(per_group));
  m.impl("fake_quantize_learnable_per_group_affine", TORCH_FN(learnable_per_group));
}

// ---- C++ entry points ------------------------------------------------------------------------

at::Tensor fake_quantize_per_group_affine(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t axis,
                                          int64_t group_size, int64_t quant_min,
                                          int64_t quant_max) {
  static auto op = detail::op_handle<decltype(fake_quantize_per_group_affine)>(
      "mqbench::fake_quantize_per_group_affine");
  return op.call(x, scale, zero_point, axis, group_size, quant_min, quant_max);
}

at::Tensor fake_quantize_learnable_per_group_affine(const at::Tensor& x, const at::Tensor& scale,
                                                    const at::Tensor& zero_point, int64_t axis,
                                                    int64_t group_size, int64_t quant_min,
                                                    int64_t quant_max, double grad_factor) {
  static auto op = detail::op_handle<decltype(fake_quantize_learnable_per_group_affine)>(
      "mqbench::fake_quantize_learnable_per_group_affine");
  return op.call(x, scale, zero_point, axis, group_size, quant_min, quant_max, grad_factor);
}

}  // namespace ops
}  // namespace mqbench
