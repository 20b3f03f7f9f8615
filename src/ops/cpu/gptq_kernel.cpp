// GPTQ's column step (ops/cpu/gptq_kernel.h) on whole vector registers: the rows of a column are
// contiguous, so the rounding of a column and its rank-one update of the block's later columns
// are loops over out_f floats (512 to 1536 on the decoders of docs/llm.md), where the block's
// rows (row-major, a few dozen floats after the current column) gave short loops and a scalar
// rounding per element. The float operations are those of the ATen sequence in
// src/ops/llm_gptq.cpp, lane by lane (1 / s, x * (1 / s), round half to even, + z, clamp, - z,
// * s, w0 - q, w + e * g; no contraction in these files): the same bits in each capability.

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu/gptq_kernel.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

using VF = at::vec::Vectorized<float>;
constexpr int64_t kLanes = VF::size();

inline float quantize_scalar(float x, float s, float z, float qmin, float qmax) {
  const float inv = 1.0f / s;
  const float level = std::min(std::max(std::nearbyint(x * inv) + z, qmin), qmax);
  return (level - z) * s;
}

void gptq_column(const GptqColumn& c) {
  const int64_t m = c.out_f;
  const int64_t body = m - m % kLanes;
  const VF qmin(c.quant_min), qmax(c.quant_max), one(1.0f);
  for (int64_t r = 0; r < body; r += kLanes) {
    const VF s = c.one_scale ? VF(c.scale[0]) : VF::loadu(c.scale + r);
    const VF z = c.one_scale ? VF(c.zero[0]) : VF::loadu(c.zero + r);
    const VF level = at::vec::clamp((VF::loadu(c.cols + r) * (one / s)).round() + z, qmin, qmax);
    const VF q = (level - z) * s;
    const VF e = VF::loadu(c.w0 + r) - q;  // w0 read before q is stored: q may be w0's row
    q.store(c.q + r);
    e.store(c.err + r);
  }
  for (int64_t r = body; r < m; ++r) {
    const int64_t k = c.one_scale ? 0 : r;
    const float q = quantize_scalar(c.cols[r], c.scale[k], c.zero[k], c.quant_min, c.quant_max);
    c.err[r] = c.w0[r] - q;
    c.q[r] = q;
  }
  for (int64_t j = 1; j <= c.rest; ++j) {
    float* dst = c.cols + j * m;
    const VF g(c.grow[j]);
    for (int64_t r = 0; r < body; r += kLanes) {
      (VF::loadu(dst + r) + VF::loadu(c.err + r) * g).store(dst + r);
    }
    for (int64_t r = body; r < m; ++r) dst[r] += c.err[r] * c.grow[j];
  }
}

}  // namespace

MQBENCH_REGISTER_STUB(gptq_column_stub, gptq_column);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
