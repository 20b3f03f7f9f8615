// AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
// Acceleration"): the grid search of the per-input-channel scale, a composite of ATen ops
// (CompositeImplicitAutograd), with the op sequence of the Python reference
// (tests/python/reference.py: awq_search_scale_reference), which the tests hold it equal to.
//
// For the Linears W_1..W_k that read the same input X ([tokens, in]), ratio r = i / grid:
//   s(r) = clamp(x_mean^r / w_mean^(1 - r), 1e-4);  s /= sqrt(max(s) * min(s))
//   loss(r) = sum_l mean((X / s) Q(W_l * s)^T - X W_l^T)^2        (Q: round to nearest)
// and candidate i = grid is s = 1 (no scaling), which wins ties. Each loss goes through the
// inputs' Gram matrix G = X^T X: with D = Q(W s) / s - W, (X / s) Q(W s)^T - X W^T = X D^T and
// mean(X D^T)^2 = sum(D * (D G)) / (tokens * out): out * in^2 per candidate instead of
// tokens * in * out (5-16x less on a Llama block's shapes at 4096 tokens).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>
#include <tuple>
#include <vector>

#include "mqbench/ops/llm.h"
#include "ops/common/op_handle.h"
#include "ops/llm_quant.h"

namespace mqbench {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor> search_scale_impl(const at::Tensor& x,
                                                     at::TensorList weights,
                                                     const at::Tensor& x_mean,
                                                     const at::Tensor& w_mean, int64_t grid,
                                                     int64_t quant_min, int64_t quant_max,
                                                     bool symmetric, bool per_channel,
                                                     int64_t group_size) {
  const char* op = "awq_search_scale";
  const llm::WeightGrid g{quant_min, quant_max, symmetric, per_channel, group_size};
  llm::check_grid(g, op);
  TORCH_CHECK(grid > 0, op, ": grid must be > 0, got ", grid);
  TORCH_CHECK(x.dim() == 2, op, ": x must be [tokens, in], got ", x.sizes());
  TORCH_CHECK(!weights.empty(), op, ": weights is empty");
  const int64_t in_f = x.size(1);
  TORCH_CHECK(x_mean.numel() == in_f && w_mean.numel() == in_f, op, ": x_mean and w_mean must "
              "have ", in_f, " elements, got ", x_mean.numel(), " and ", w_mean.numel());
  for (const auto& w : weights) {
    TORCH_CHECK(w.dim() == 2 && w.size(1) == in_f, op, ": every weight must be [out, ", in_f,
                "], got ", w.sizes());
    TORCH_CHECK(group_size == 0 || in_f % group_size == 0, op, ": group_size (", group_size,
                ") does not divide the ", in_f, " input channels");
    TORCH_CHECK(w.device() == x.device(), op, ": a weight is on ", w.device(), " but x is on ",
                x.device());
  }
  const auto xf = x.to(at::kFloat);
  const auto gram = at::matmul(xf.t(), xf);
  const double n_tok = static_cast<double>(x.size(0));
  std::vector<at::Tensor> ws;
  for (const auto& w : weights) {
    ws.push_back(w.detach().to(at::kFloat));
  }
  const auto xm = x_mean.to(at::kFloat).reshape({in_f});
  const auto wm = w_mean.to(at::kFloat).reshape({in_f});
  auto losses = at::empty({grid + 1}, at::TensorOptions().dtype(at::kDouble));
  auto* loss_out = losses.data_ptr<double>();
  at::Tensor best;
  double best_loss = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i <= grid; ++i) {
    at::Tensor s;
    if (i == grid) {
      s = at::ones({in_f}, xm.options());
    } else {
      const double r = static_cast<double>(i) / static_cast<double>(grid);
      s = at::clamp_min(xm.pow(r) / wm.pow(1.0 - r), 1e-4);
      s = s / (s.max() * s.min()).sqrt();
    }
    double loss = 0.0;
    for (size_t l = 0; l < ws.size(); ++l) {
      const auto d = llm::rtn_weight(ws[l] * s.view({1, -1}), g) / s.view({1, -1}) - ws[l];
      loss += (at::matmul(d, gram) * d).sum(at::kDouble).item<double>() /
              (n_tok * static_cast<double>(ws[l].size(0)));
    }
    loss_out[i] = loss;
    if (loss < best_loss || (i == grid && loss <= best_loss)) {
      best = s;
      best_loss = loss;
    }
  }
  return {best, losses};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("awq_search_scale(Tensor x, Tensor[] weights, Tensor x_mean, Tensor w_mean, int grid, "
        "int quant_min, int quant_max, bool symmetric, bool per_channel, int group_size) -> "
        "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("awq_search_scale", TORCH_FN(search_scale_impl));
}

std::tuple<at::Tensor, at::Tensor> awq_search_scale(const at::Tensor& x, at::TensorList weights,
                                                    const at::Tensor& x_mean,
                                                    const at::Tensor& w_mean, int64_t grid,
                                                    int64_t quant_min, int64_t quant_max,
                                                    bool symmetric, bool per_channel,
                                                    int64_t group_size) {
  static auto op = detail::op_handle<decltype(awq_search_scale)>("mqbench::awq_search_scale");
  return op.call(x, weights, x_mean, w_mean, grid, quant_min, quant_max, symmetric, per_channel,
                 group_size);
}

}  // namespace ops
}  // namespace mqbench
