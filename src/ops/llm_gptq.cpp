// GPTQ (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers"): the Hessian accumulation and the column loop, as composites of
// ATen ops (CompositeImplicitAutograd, like ptq.cpp): they run on every device ATen runs on, in
// float32, with the op sequence of the Python reference (python/mqbench/llm/gptq.py), which the
// tests hold them equal to.
//
// For a layer y = W x with calibration inputs X ([N, in]):
//   H = 2/N X^T X                           (running: H_{n+m} = n/(n+m) H_n + 2/(n+m) x^T x;
//                                            x^T x from its upper blocks: Note [Hessian ...])
//   dead inputs (H_jj = 0): H_jj = 1, W[:, j] = 0
//   H += damp * mean(diag H) * I;  H = R R^T with R upper (Note [GPTQ from the factor of H])
//     not positive definite: damp *= 10 with a warning (at most 8 times), so no NaN weight
//   for each column j (in blocks of block_size; act_order: by decreasing H_jj), w0 the weight
//   before any update:
//     q_j = Q(w_j);  W[:, k] += (w0_j - q_j) R_jk / R_kk   (k > j)
// Grids: per tensor / per channel from W up front; groups from their columns when the group
// starts (updated by the errors of earlier columns), or up front with act_order ("static
// groups", so the groups stay contiguous in the original order as the group-wise format needs).

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "mqbench/ops/llm.h"
#include "ops/common/op_handle.h"
#include "ops/llm_quant.h"

namespace mqbench {
namespace ops {
namespace {

constexpr int kMaxDampTries = 8;

// Note [Hessian from its upper blocks]
// X^T X is symmetric: it is computed one band of kGramBlock rows at a time, each band from its
// diagonal block rightwards (one matmul per band), and mirrored into the lower part. That is
// about half the multiply-adds of the full product for wide layers (58 % at 768 inputs, 75 %
// at 256), and H comes out exactly symmetric. The Python reference (gram_reference in
// python/mqbench/llm/gptq.py) makes the same matmul calls on the same slices: the same bits.
constexpr int64_t kGramBlock = 128;

at::Tensor gram(const at::Tensor& x) {
  const int64_t n = x.size(1);
  if (n <= kGramBlock) return at::matmul(x.t(), x);
  auto G = at::empty({n, n}, x.options());
  for (int64_t i0 = 0; i0 < n; i0 += kGramBlock) {
    const int64_t i1 = std::min(i0 + kGramBlock, n);
    const auto band = at::matmul(x.slice(1, i0, i1).t(), x.slice(1, i0));  // [i1 - i0, n - i0]
    G.slice(0, i0, i1).slice(1, i0).copy_(band);
    G.slice(0, i1).slice(1, i0, i1).copy_(band.slice(1, i1 - i0).t());
  }
  return G;
}

at::Tensor hessian_update_impl(const at::Tensor& H, const at::Tensor& x, int64_t n_seen) {
  const char* op = "gptq_hessian_update";
  TORCH_CHECK(H.dim() == 2 && H.size(0) == H.size(1), op, ": H must be square, got ", H.sizes());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == H.size(0), op, ": x must be [tokens, ", H.size(0),
              "], got ", x.sizes());
  TORCH_CHECK(n_seen >= 0, op, ": n_seen must be >= 0, got ", n_seen);
  TORCH_CHECK(H.device() == x.device(), op, ": H is on ", H.device(), " but x is on ",
              x.device());
  const auto xf = x.to(at::kFloat);
  const int64_t total = n_seen + xf.size(0);
  if (total == 0) return H.to(at::kFloat);
  const auto Hs = H.to(at::kFloat) * (static_cast<double>(n_seen) / total);
  const auto xs = xf * std::sqrt(2.0 / static_cast<double>(total));
  return Hs + gram(xs);
}

// Whether every element is finite: a finite sum says so at the cost of one pass (a non-finite
// element makes the sum inf or NaN); an overflowing sum of finite elements gets the full check.
bool all_finite(const at::Tensor& t) {
  return at::isfinite(t.sum()).item<bool>() || at::isfinite(t).all().item<bool>();
}

// Note [GPTQ from the factor of H]
// The paper spreads column j's rounding error through U, the upper Cholesky factor of H^-1:
// err_j = (w_j - q_j) / U_jj, W[:, k] -= err_j U_jk. With w0 the weight before any update and
// D = W0 - Q, the updates give D = E U (E the errors), so E = D U^-1. U^-1 is R, the upper
// triangular factor with H = R R^T (U^T U = H^-1 = R^-T R^-1). Column k, when its turn comes,
// is then w0_k + sum_{j<k} (w0_j - q_j) R_jk / R_kk: the same sequence of weights, with no
// inverse. R is the Cholesky factor of J H J (J reverses the order) reversed. One Cholesky,
// where Cholesky, inverse from it and a second Cholesky took about 3x the time (n = 1536, one
// thread, in torch: 92 against 30 ms with G; each ATen Cholesky also zeroes a triangle in a
// slow strided pass). The float
// rounding differs from the paper's route; tests/python/test_llm.py holds the results to the
// paper's formulation (test_gptq_from_the_factor_of_h_matches_the_paper). The Python
// reference (gptq_quantize_weight_reference) makes the same ATen calls: the same bits.
at::Tensor error_factor(const at::Tensor& Hd) {
  auto [L, info] = at::linalg_cholesky_ex(Hd.flip({0, 1}));
  if (info.item<int64_t>() != 0) return at::Tensor();
  const auto R = L.flip({0, 1});
  auto G = R / at::diag(R);  // G[j, k] = R[j, k] / R[k, k]
  return all_finite(G) ? G : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor> group_qparams(const at::Tensor& cols,
                                                 const llm::WeightGrid& g) {
  auto qp = llm::minmax_qparams(cols.amin(1), cols.amax(1), g);
  return {qp.first, qp.second};
}

// Note [GPTQ column loop on the CPU]
// The column loop is GPTQ's sequential part: per column, a rounding, an error and a rank-one
// update of the block's columns left, each a few hundred floats. As ATen ops that is a dozen
// dispatches per column, whose overhead outweighed the arithmetic on the decoder of docs/llm.md.
// On the CPU the loop runs here on raw pointers with the very float operations of the ATen
// sequence (1 / s, x * (1 / s), nearbyint, + z, clamp, - z, * s, w0 - q, w += e * g; the
// build has -ffp-contract=off), so both give the same bits; other devices keep the ATen ops.
struct ColumnPtrs {
  float* w1;          // [out, bs] block columns, row-major (updated in place)
  float* err1;        // [out, bs] the block's errors w0 - q
  float* q;           // [out, n] the quantized weight (column `col` written)
  const float* w0;    // [out, n] the weight before any update
  const float* grow;  // row i of the block's [bs, bs] part of G, from its diagonal
  const float* scale;  // [rows, ngroups]
  const float* zero;
};

void quantize_column_cpu(const ColumnPtrs& p, int64_t out_f, int64_t bs, int64_t n, int64_t i,
                         int64_t col, int64_t k, int64_t ngroups, bool one_row,
                         const llm::WeightGrid& g) {
  const float qmin = static_cast<float>(g.quant_min), qmax = static_cast<float>(g.quant_max);
  const int64_t rest = bs - i - 1;  // block columns after i
  for (int64_t r = 0; r < out_f; ++r) {
    const int64_t qi = (one_row ? 0 : r) * ngroups + k;
    const float s = p.scale[qi], z = p.zero[qi];
    float* row = p.w1 + r * bs + i;
    const float inv = 1.0f / s;
    const float level = std::min(std::max(std::nearbyint(row[0] * inv) + z, qmin), qmax);
    const float q = (level - z) * s;
    p.q[r * n + col] = q;
    const float e = p.w0[r * n + col] - q;
    p.err1[r * bs + i] = e;
    for (int64_t c = 1; c <= rest; ++c) row[c] += e * p.grow[c];
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, double> quantize_weight_impl(
    const at::Tensor& weight, const at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size, double damp,
    bool act_order, c10::string_view name) {
  const char* op = "gptq_quantize_weight";
  const llm::WeightGrid g{quant_min, quant_max, symmetric, per_channel, group_size};
  llm::check_grid(g, op);
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be [out, in], got ", weight.sizes());
  const int64_t out_f = weight.size(0), n = weight.size(1);
  TORCH_CHECK(hessian.dim() == 2 && hessian.size(0) == n && hessian.size(1) == n, op,
              ": hessian must be [", n, ", ", n, "], got ", hessian.sizes());
  TORCH_CHECK(group_size == 0 || n % group_size == 0, op, ": group_size (", group_size,
              ") does not divide the ", n, " input channels");
  TORCH_CHECK(block_size > 0, op, ": block_size must be > 0, got ", block_size);
  TORCH_CHECK(std::isfinite(damp) && damp >= 0.0, op, ": damp must be >= 0, got ", damp);
  TORCH_CHECK(weight.device() == hessian.device(), op, ": weight is on ", weight.device(),
              " but hessian is on ", hessian.device());
  TORCH_CHECK(all_finite(hessian), op, ": the Hessian of ", name,
              " has non-finite entries (non-finite calibration activations)");

  auto W = weight.detach().to(at::kFloat).clone(at::MemoryFormat::Contiguous);
  auto H = hessian.detach().to(at::kFloat).clone();
  const auto dead = at::diagonal(H) == 0;
  {
    auto d = at::diagonal(H);
    d.masked_fill_(dead, 1.0);
    W.masked_fill_(dead.unsqueeze(0), 0.0);
  }
  const int64_t ngroups = group_size > 0 ? n / group_size : 1;
  const auto fopts = W.options();
  auto scale = at::empty({(per_channel || group_size > 0) ? out_f : 1, ngroups}, fopts);
  auto zero = at::empty_like(scale);
  bool static_groups = false;
  if (group_size == 0) {
    at::Tensor s, z;
    if (per_channel) {
      std::tie(s, z) = group_qparams(W, g);
    } else {
      auto qp = llm::minmax_qparams(W.min().reshape({1}), W.max().reshape({1}), g);
      s = qp.first;
      z = qp.second;
    }
    scale.select(1, 0).copy_(s);
    zero.select(1, 0).copy_(z);
  } else if (act_order) {
    static_groups = true;
    for (int64_t k = 0; k < ngroups; ++k) {
      auto qp = group_qparams(W.slice(1, k * group_size, (k + 1) * group_size), g);
      scale.select(1, k).copy_(std::get<0>(qp));
      zero.select(1, k).copy_(std::get<1>(qp));
    }
  }
  at::Tensor perm;
  std::vector<int64_t> perm_host;
  if (act_order) {
    perm = at::argsort(at::diag(H), /*stable=*/false, /*dim=*/0, /*descending=*/true);
    W = W.index_select(1, perm);
    H = H.index_select(0, perm).index_select(1, perm);
    const auto perm_cpu = perm.to(at::kCPU).to(at::kLong).contiguous();
    perm_host.assign(perm_cpu.data_ptr<int64_t>(), perm_cpu.data_ptr<int64_t>() + n);
  }
  // at::diag (a contiguous copy), as the reference's torch.diag: a mean over the strided
  // diagonal view sums in another order, and one ulp of damping moves roundings downstream
  const double mean_diag = at::mean(at::diag(H)).item<double>();
  double rel = damp;
  at::Tensor G;  // Note [GPTQ from the factor of H]
  const auto eye = at::eye(n, fopts);
  for (int t = 0; t < kMaxDampTries; ++t) {
    G = error_factor(H + eye * (rel * mean_diag));
    if (G.defined()) break;
    const double new_rel = rel > 0 ? rel * 10 : 1e-6;
    TORCH_WARN("gptq: the Hessian of ", name, " is not positive definite with damp=", rel,
               "; raising damp to ", new_rel);
    rel = new_rel;
  }
  TORCH_CHECK(G.defined(), op, ": the Hessian of ", name, " stays singular up to damp=", rel);

  const auto W0 = W.clone();  // the weight before any update: each column's error is w0 - q
  auto Q = at::zeros_like(W);
  const bool cpu = W.is_cpu();
  // a row-major copy for the raw loop (W, W0 and Q are contiguous already); the ATen ops below
  // keep the reference's layout of G
  const auto Gc = cpu ? G.contiguous() : at::Tensor();
  for (int64_t i1 = 0; i1 < n; i1 += block_size) {
    const int64_t i2 = std::min(i1 + block_size, n);
    auto W1 = W.slice(1, i1, i2).clone(at::MemoryFormat::Contiguous);
    auto D1 = at::zeros_like(W1);
    const auto G1 = G.slice(0, i1, i2).slice(1, i1, i2);
    for (int64_t i = 0; i < i2 - i1; ++i) {
      const int64_t col = i1 + i;
      const int64_t orig = act_order ? perm_host[col] : col;
      const int64_t k = group_size > 0 ? orig / group_size : 0;
      if (group_size > 0 && !static_groups && col % group_size == 0) {
        // the group's grid from its columns as they are now (updated by earlier errors)
        const auto cols =
            at::cat({W1.slice(1, i), W.slice(1, i2)}, 1).slice(1, 0, group_size);
        auto qp = group_qparams(cols, g);
        scale.select(1, k).copy_(std::get<0>(qp));
        zero.select(1, k).copy_(std::get<1>(qp));
      }
      if (cpu) {  // Note [GPTQ column loop on the CPU]
        const ColumnPtrs p{W1.data_ptr<float>(), D1.data_ptr<float>(), Q.data_ptr<float>(),
                           W0.data_ptr<float>(), Gc.data_ptr<float>() + col * n + col,
                           scale.data_ptr<float>(), zero.data_ptr<float>()};
        quantize_column_cpu(p, out_f, i2 - i1, n, i, col, k, ngroups, scale.size(0) == 1, g);
        continue;
      }
      const auto q = llm::fake_quant(W1.select(1, i), scale.select(1, k), zero.select(1, k), g);
      Q.select(1, col).copy_(q);
      const auto d = W0.select(1, col) - q;
      W1.slice(1, i + 1).add_(d.unsqueeze(1) * G1.select(0, i).slice(0, i + 1).unsqueeze(0));
      D1.select(1, i).copy_(d);
    }
    if (i2 < n) {
      W.slice(1, i2).add_(at::matmul(D1, G.slice(0, i1, i2).slice(1, i2)));
    }
  }
  if (act_order) Q = Q.index_select(1, at::argsort(perm));
  return {Q, scale, zero, rel};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("gptq_hessian_update(Tensor H, Tensor x, int n_seen) -> Tensor");
  m.def("gptq_quantize_weight(Tensor weight, Tensor hessian, int quant_min, int quant_max, "
        "bool symmetric, bool per_channel, int group_size, int block_size=128, float damp=0.01, "
        "bool act_order=False, str name=\"layer\") -> (Tensor, Tensor, Tensor, float)");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("gptq_hessian_update", TORCH_FN(hessian_update_impl));
  m.impl("gptq_quantize_weight", TORCH_FN(quantize_weight_impl));
}

at::Tensor gptq_hessian_update(const at::Tensor& H, const at::Tensor& x, int64_t n_seen) {
  static auto op =
      detail::op_handle<decltype(gptq_hessian_update)>("mqbench::gptq_hessian_update");
  return op.call(H, x, n_seen);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, double> gptq_quantize_weight(
    const at::Tensor& weight, const at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size, double damp,
    bool act_order, c10::string_view name) {
  static auto op =
      detail::op_handle<decltype(gptq_quantize_weight)>("mqbench::gptq_quantize_weight");
  return op.call(weight, hessian, quant_min, quant_max, symmetric, per_channel, group_size,
                 block_size, damp, act_order, name);
}

}  // namespace ops
}  // namespace mqbench
