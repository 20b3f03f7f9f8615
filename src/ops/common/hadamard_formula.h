#pragma once
// The Walsh-Hadamard transform of hadamard_transform (ops/hadamard_transform.cpp): the butterfly
// written once for the CPU kernel's scalar and vector loops and the CUDA kernels (Note [One
// formula for scalar, vector and device] in device_math.h), and the argument checks shared by
// the CPU and CUDA entry points.
//
// Note [Hadamard transform]
// For every row x_r of x viewed as [rows, n], n = x.size(-1) = m * p with p = 2^k:
//   y_r = scale * (H_m kron S_p) x_r
// where S_p is Sylvester's Hadamard matrix in natural order (S_1 = [1],
// S_2j = [[S_j, S_j], [S_j, -S_j]]) and H_m is `had` ([m, m], any values; m = 1, H = [1] when
// had is None). With the row viewed as the row-major matrix X [m, p], (H kron S) x = vec(H X S)
// (S is symmetric), so the op computes, in the compute type C (float32 for float32, float16 and
// bfloat16 input; float64 for float64):
//   1. the fast Walsh-Hadamard transform of each of the m segments of p elements: k stages,
//      h = 1, 2, ..., p / 2, each replacing every pair (a, b) = (z[j], z[j + h]) (j with bit h
//      clear) by (a + b, a - b);
//   2. the mixing along the m axis, each output element one sum in a fixed order:
//      acc = H[i][0] * z[0][j], then acc = acc + H[i][i'] * z[i'][j] for i' = 1 .. m - 1;
//   3. y = acc * scale (without had: y = z * scale), rounded once to x's dtype.
// Every kernel (CPU scalar, CPU vector, CUDA) performs these very operations, each rounded once
// (no fused multiply-add: -ffp-contract=off, --fmad=false), so they agree bit for bit; a dense
// x @ M^T (M = scale * (H kron S)) sums in another order and agrees to rounding.
// Gradient: y = x M^T is linear, so dx = dy M = hadamard_transform(dy, H^T, scale) (S^T = S).
// `had` gets no gradient: it is a fixed rotation (the autograd kernel refuses an `had` that
// requires grad). QuaRot (Ashkboos et al. 2024) rotates activations with these matrices
// (scale = 1 / sqrt(n) and a Hadamard H: an orthogonal M).

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

#include "ops/common/device_math.h"

namespace mqbench {
namespace ops {
namespace detail {

/// x (contiguous), the mixing matrix and the sizes of Note [Hadamard transform].
struct HadamardArgs {
  at::Tensor x;    // contiguous, x's dtype
  at::Tensor had;  // [m, m] contiguous in the compute type on x's device, or undefined
  int64_t rows = 0, n = 0, m = 1, p = 1;
};

/// Checks x (float32 / float64 / float16 / bfloat16, at least one dimension) and had (None, or
/// a floating [m, m] matrix on x's device with x.size(-1) = m * 2^k) and returns HadamardArgs;
/// raises naming `op` and the offending sizes. An empty last axis (n = 0) is accepted.
HadamardArgs prepare_hadamard(const at::Tensor& x, const c10::optional<at::Tensor>& had,
                              const char* op);

MQBENCH_FORMULA_NS_BEGIN

/// One butterfly of the transform: (a, b) -> (a + b, a - b).
template <typename V>
MQBENCH_HOST_DEVICE void hadamard_butterfly(V& a, V& b) {
  const V s = a + b;
  b = a - b;
  a = s;
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench
