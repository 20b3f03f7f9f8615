#pragma once
// GPTQ's column step on the CPU (Note [GPTQ column loop on the CPU] in src/ops/llm_gptq.cpp),
// dispatched by CPU capability (Note [CPU capability dispatch]).

#include <cstdint>

#include "ops/cpu/dispatch.h"

namespace mqbench {
namespace cpu {

/// One column of a block held column by column: `cols` points at the block's current column
/// (out_f floats; the block's later columns follow it, out_f apart). Writes the quantized column
/// to `q` and its error w0 - q to `err`, then adds err * grow[c] to the c-th later column, for
/// c = 1 .. rest. `scale` / `zero` hold one value per row, or one for all rows (`one_scale`).
/// `q` may be `w0` (each element is read before it is written).
struct GptqColumn {
  float* cols;
  float* q;
  float* err;
  const float* w0;
  const float* grow;
  const float* scale;
  const float* zero;
  int64_t out_f;
  int64_t rest;
  bool one_scale;
  float quant_min;
  float quant_max;
};
using gptq_column_fn = void (*)(const GptqColumn& c);
MQBENCH_DECLARE_STUB(gptq_column_stub, gptq_column_fn);

}  // namespace cpu
}  // namespace mqbench
