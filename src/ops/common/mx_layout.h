#pragma once
// The host-side layout of the block-scaled ops (fake_quantize_mx, fake_quantize_nvfp4), shared by
// the CPU op (ops/fake_quantize_mx.cpp) and the CUDA op (ops/cuda/mx_kernel.cu): the blocks run
// along `axis`, which is moved last and made contiguous, so the kernels see a rows x cols matrix
// with blocks of `block` consecutive elements per row (the last one shorter when cols % block is
// not 0: as if zero-padded, which leaves every amax unchanged).

#include <ATen/core/Tensor.h>

#include <string>

#include "ops/common/mx_formula.h"

namespace mqbench {
namespace ops {
namespace detail {

struct BlockLayout {
  at::Tensor x;  // x with `axis` moved last, contiguous (dtype unchanged)
  int64_t axis = -1;
  int64_t rows = 0;
  int64_t cols = 0;
};

inline BlockLayout block_layout(const at::Tensor& x, int64_t block_size, int64_t axis,
                                const char* op) {
  TORCH_CHECK(block_size > 0, op, ": block_size must be positive, got ", block_size);
  BlockLayout l;
  if (x.dim() == 0) {
    TORCH_CHECK(axis == -1 || axis == 0, op, ": axis ", axis, " is out of range for a 0-dim x");
    l.axis = 0;
    l.x = x.reshape({1});
  } else {
    TORCH_CHECK(axis >= -x.dim() && axis < x.dim(), op, ": axis ", axis,
                " is out of range for x with ", x.dim(), " dimensions");
    l.axis = axis < 0 ? axis + x.dim() : axis;
    l.x = (l.axis == x.dim() - 1 ? x : x.movedim(l.axis, -1)).contiguous();
  }
  l.cols = l.x.size(-1);
  l.rows = l.cols == 0 ? 0 : l.x.numel() / l.cols;
  return l;
}

/// The kernel's output (laid out as BlockLayout::x) back in x's shape, contiguous.
inline at::Tensor from_block_layout(const at::Tensor& out, const BlockLayout& l,
                                    const at::Tensor& x) {
  if (x.dim() == 0) return out.reshape({});
  if (l.axis == x.dim() - 1) return out;
  return out.movedim(-1, l.axis).contiguous();
}

/// fake_quantize_mx's elem_dtype: "mxfp8_e4m3" (E4M3), "mxfp6_e3m2" (E3M2), "mxfp6_e2m3" (E2M3)
/// or "mxfp4" (E2M1); anything else raises.
inline MxElement mx_element(const std::string& elem_dtype, const char* op) {
  if (elem_dtype == "mxfp8_e4m3") return MxElement::kE4M3;
  if (elem_dtype == "mxfp6_e3m2") return MxElement::kE3M2;
  if (elem_dtype == "mxfp6_e2m3") return MxElement::kE2M3;
  if (elem_dtype == "mxfp4") return MxElement::kE2M1;
  TORCH_CHECK(false, op, ": elem_dtype must be \"mxfp8_e4m3\", \"mxfp6_e3m2\", \"mxfp6_e2m3\" or "
              "\"mxfp4\", got \"", elem_dtype, "\"");
}

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
