// GPTQ (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers"): the Hessian accumulation and the column loop, as composites of
// ATen ops (CompositeImplicitAutograd, like ptq.cpp): they run on every device ATen runs on, in
// float32, with the op sequence of the Python reference (tests/python/reference.py), which the
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
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "mqbench/ops/llm.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/gptq_kernel.h"
#include "ops/llm_quant.h"

// LAPACK's Cholesky factorization, as torch's library exports it (ATen's own call): weak, so
// that a torch without it loads us and takes the ATen path (Note [Cholesky through LAPACK on
// the CPU]).
#if defined(__ELF__)
extern "C" void spotrf_(char* uplo, int* n, float* a, int* lda, int* info) __attribute__((weak));
#define MQBENCH_HAVE_WEAK_SPOTRF 1
#endif

namespace mqbench {
namespace cpu {

MQBENCH_DEFINE_STUB(gptq_column_stub, gptq_column_fn);

}  // namespace cpu

namespace ops {
namespace {

constexpr int kMaxDampTries = 8;

// Note [Hessian from its upper blocks]
// X^T X is symmetric: it is computed one band of kGramBlock rows at a time, each band from its
// diagonal block rightwards, and mirrored into the lower part. That is about half the
// multiply-adds of the full product for wide layers (58 % at 768 inputs, 75 % at 256). Each
// band is one addmm that also takes the running H's band and both scalings (beta = n_seen /
// total, alpha = 2 / total) and writes into the result in place: no scaled copy of x and no
// [n, n] temporaries (a 2048 x 1536 update: 49.6 -> 42.1 ms, one thread; docs/design/llm.md).
// With alpha != 1 BLAS's x^T x is not exactly symmetric in the diagonal block (MKL's is not),
// so each diagonal block's upper triangle is mirrored into its lower one: H comes out exactly
// symmetric, which the factorization relies on (Note [Cholesky through LAPACK on the CPU]).
// The Python reference (gram_update_reference in tests/python/reference.py) makes the same
// calls on the same slices: the same bits.
constexpr int64_t kGramBlock = 128;

// The diagonal block's upper triangle mirrored into its lower one, in place: BLAS does not
// promise a symmetric x^T x (MKL's is not with alpha != 1).
void mirror_upper(at::Tensor d) {
  const auto upper = at::ones({d.size(0), d.size(1)}, d.options().dtype(at::kBool)).triu_();
  d.copy_(at::where(upper, d, d.t()));
}

// beta * H + alpha * x^T x into out ([n, n]: a new tensor, or H itself): one addmm per band,
// each writing its part of the result in place (Note [Hessian from its upper blocks]). A band
// reads H's rows i0..i1 from column i0 on, which no earlier band wrote (they wrote their own
// rows, and columns below i0 of later rows), so out may be H: the same calls, the same bits.
at::Tensor scaled_gram_add(const at::Tensor& H, const at::Tensor& x, double beta, double alpha,
                           at::Tensor out) {
  const int64_t n = x.size(1);
  const bool in_place = out.is_same(H);
  for (int64_t i0 = 0; i0 < n; i0 += kGramBlock) {
    const int64_t i1 = std::min(i0 + kGramBlock, n);
    auto band = out.slice(0, i0, i1).slice(1, i0);  // [i1 - i0, n - i0]
    if (in_place) {
      band.addmm_(x.slice(1, i0, i1).t(), x.slice(1, i0), beta, alpha);
    } else {
      at::addmm_out(band, H.slice(0, i0, i1).slice(1, i0), x.slice(1, i0, i1).t(),
                    x.slice(1, i0), beta, alpha);
    }
    mirror_upper(band.slice(1, 0, i1 - i0));
    out.slice(0, i1).slice(1, i0, i1).copy_(band.slice(1, i1 - i0).t());
  }
  return out;
}

void check_hessian_update(const char* op, const at::Tensor& H, const at::Tensor& x,
                          int64_t n_seen) {
  TORCH_CHECK(H.dim() == 2 && H.size(0) == H.size(1), op, ": H must be square, got ", H.sizes());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == H.size(0), op, ": x must be [tokens, ", H.size(0),
              "], got ", x.sizes());
  TORCH_CHECK(n_seen >= 0, op, ": n_seen must be >= 0, got ", n_seen);
  TORCH_CHECK(H.device() == x.device(), op, ": H is on ", H.device(), " but x is on ",
              x.device());
}

at::Tensor hessian_update_impl(const at::Tensor& H, const at::Tensor& x, int64_t n_seen) {
  check_hessian_update("gptq_hessian_update", H, x, n_seen);
  const auto xf = x.to(at::kFloat);
  const int64_t total = n_seen + xf.size(0);
  if (total == 0) return H.to(at::kFloat);
  // H_total = n_seen / total * H + 2 / total * x^T x, the scalings inside the products
  const auto Hf = H.to(at::kFloat);
  return scaled_gram_add(Hf, xf, static_cast<double>(n_seen) / total,
                         2.0 / static_cast<double>(total),
                         at::empty({Hf.size(0), Hf.size(1)}, Hf.options()));
}

// The same in H's own buffer (a float32 contiguous H; another H gets the result copied in):
// no second [n, n] matrix, which for a 7168-wide down_proj was 205 MB beside H at each update.
at::Tensor& hessian_update_in_place_impl(at::Tensor& H, const at::Tensor& x, int64_t n_seen) {
  check_hessian_update("gptq_hessian_update_", H, x, n_seen);
  const int64_t total = n_seen + x.size(0);
  if (total == 0) return H;
  if (H.scalar_type() != at::kFloat || !H.is_contiguous()) {
    H.copy_(hessian_update_impl(H, x, n_seen));
    return H;
  }
  scaled_gram_add(H, x.to(at::kFloat), static_cast<double>(n_seen) / total,
                  2.0 / static_cast<double>(total), H);
  return H;
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
// inverse. R is the Cholesky factor of J H J (J reverses the order) reversed: with
// C^T C = J H J (C upper), R = J C^T J. One Cholesky, where Cholesky, inverse from it and a
// second Cholesky took about 3x the time (n = 1536, one thread, in torch: 92 against 30 ms with
// G). The float rounding differs from the paper's route; tests/python/llm/test_llm.py holds the
// results to the paper's formulation (test_gptq_from_the_factor_of_h_matches_the_paper). The
// Python reference (gptq_quantize_weight_reference) makes the same calls: the same bits.
//
// Note [Cholesky through LAPACK on the CPU]
// ATen's linalg_cholesky_ex copies its input column-major, calls LAPACK's potrf and then
// zeroes the other triangle in a strided pass that cost twice the factorization (n = 1536:
// 22 ms against 10 ms; the copy and the flips another 9 ms). On the CPU the op calls the same
// LAPACK routine (spotrf_, which torch's library exports; declared weak, so a torch without it
// takes the ATen path) on the bytes it reads there: with uplo 'U' LAPACK reads the upper
// triangle of the column-major matrix, A[i][j] for i <= j at offset j * n + i, which in a
// row-major buffer is the lower triangle of A^T, i.e. A's upper triangle mirrored. So the op
// copies A's upper triangle into its lower one in A's own buffer (upper_into_lower; A = J H J is
// symmetric when H comes from gptq_hessian_update, and a Hessian a caller passes that is not
// exactly symmetric is read on the same triangle as ATen reads it), puts the damping on the
// diagonal and factors there. The factor C (column-major upper) is C^T in the buffer's
// row-major lower triangle; the strict upper part still holds A, which makes the lower one
// whole again when a damping fails, and is zeroed once one succeeds: the same C as
// linalg_cholesky_ex(A, upper=True), bit for bit, in no buffer of its own.

// Whether the op factors through LAPACK directly (Note [Cholesky through LAPACK on the CPU]).
bool lapack_cholesky(const at::Tensor& A) {
#ifdef MQBENCH_HAVE_WEAK_SPOTRF
  return spotrf_ != nullptr && A.is_cpu() && A.scalar_type() == at::kFloat &&
         A.size(0) <= std::numeric_limits<int>::max();
#else
  (void)A;
  return false;
#endif
}

// A's upper triangle copied into its lower one, in place (A square, contiguous float): the
// triangle LAPACK reads (Note [Cholesky through LAPACK on the CPU]), in tiles so that the
// column reads stay in cache.
void upper_into_lower(at::Tensor& A) {
  float* d = A.data_ptr<float>();
  const int64_t n = A.size(0);
  constexpr int64_t kTile = 64;
  for (int64_t i0 = 0; i0 < n; i0 += kTile) {
    const int64_t i1 = std::min(i0 + kTile, n);
    for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
      const int64_t j1 = std::min(j0 + kTile, n);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < std::min(j1, i); ++j) d[i * n + j] = d[j * n + i];
      }
    }
  }
}

// Whether the factor in A's lower triangle gives a finite G: each element over its column's
// diagonal is finite, the very divisions error_factor makes after its flip (G[j, k] =
// R[j, k] / R[k, k]). Checked before the upper triangle is zeroed, so a factor that would give
// a non-finite G still leaves A whole for a larger damping.
bool factor_ratios_finite(const at::Tensor& A) {
  const float* d = A.data_ptr<float>();
  const int64_t n = A.size(0);
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t b = 0; b <= a; ++b) {
      if (!std::isfinite(d[a * n + b] / d[b * n + b])) return false;
    }
  }
  return true;
}

// C^T (lower) with C^T C = A + shift I, through LAPACK, in A's own buffer (Note [GPTQ's n x n
// buffers]). A holds its upper triangle in its lower one too (upper_into_lower) and diag0 is
// its diagonal: LAPACK reads the triangle it read in a row-major copy of A^T, so the factor is
// the same bit for bit. True with the factor in A; false where A + shift I is not positive
// definite, with A made whole again for another shift (LAPACK wrote only the lower triangle).
bool cholesky_lower_lapack_in_place(at::Tensor& A, const at::Tensor& diag0, double shift) {
#ifdef MQBENCH_HAVE_WEAK_SPOTRF
  at::diagonal(A).copy_(diag0).add_(shift);
  char uplo = 'U';
  int n = static_cast<int>(A.size(0)), lda = std::max(n, 1), info = 0;
  spotrf_(&uplo, &n, A.data_ptr<float>(), &lda, &info);
  if (info != 0 || !factor_ratios_finite(A)) {
    upper_into_lower(A);
    return false;
  }
  A.tril_();
  return true;
#else
  (void)A;
  (void)diag0;
  (void)shift;
  return false;
#endif
}

// Note [GPTQ's n x n buffers]
// For a layer of n inputs the op's memory is a few n x n float buffers (a 14336-wide down_proj:
// 822 MB each), which bound the memory of a block-by-block run. So the caller's H is read, never
// copied (the dead inputs' unit diagonal goes to the diagonal read for act_order and to Hr), and
// each buffer is released as soon as it is used up: a half-reordered H once Hr (the
// factorization's order) is made. On the CPU, Hr is factored in its own buffer (LAPACK works in
// place; a shift that fails is undone from the triangle LAPACK leaves alone), flipped into R
// there, and G = R / diag(R) computed in R's place (the same division). Beside the caller's H
// the op then holds one n x n buffer, and none with gptq_quantize_weight_, which reorders the
// caller's H in place into Hr (the caller's last use of H). The weight's [out, n] copies go
// too once used: W once transposed, Q^T written over W0^T column by column (each w0_j read
// before q_j takes its place), and W^T and G released before Q is made.

// t.flip({0, 1}) of a contiguous square float matrix, in its own buffer (a 180-degree turn:
// element i of the flat data swaps with element n*n - 1 - i); other tensors through flip.
at::Tensor flip_both_in_place(at::Tensor t) {
  if (!t.is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous()) return t.flip({0, 1});
  float* d = t.data_ptr<float>();
  const int64_t total = t.numel();
  for (int64_t i = 0, j = total - 1; i < j; ++i, --j) std::swap(d[i], d[j]);
  return t;
}

// G with G[j, k] = R[j, k] / R[k, k], R = J C^T J, from the reversed Hessian Hr = J H J and
// the damping shift (C^T C = Hr + shift I); undefined when that is not positive definite or G
// would not be finite. On the LAPACK path G is Hr's own buffer (prepared by upper_into_lower,
// diag0 its diagonal), which a failed shift leaves as it was.
at::Tensor error_factor(at::Tensor& Hr, const at::Tensor& diag0, double shift) {
  at::Tensor Ct;
  const bool in_place = diag0.defined();
  if (in_place) {  // Note [Cholesky through LAPACK on the CPU]
    if (!cholesky_lower_lapack_in_place(Hr, diag0, shift)) return at::Tensor();
    Ct = Hr;
  } else {
    auto Hd = Hr.clone(at::MemoryFormat::Contiguous);
    at::diagonal(Hd).add_(shift);
    auto [C, info] = at::linalg_cholesky_ex(Hd, /*upper=*/true);
    if (info.item<int64_t>() == 0) Ct = C.t();
  }
  if (!Ct.defined()) return at::Tensor();
  // Note [GPTQ's n x n buffers]: R = J C^T J in the factor's own buffer
  auto G = flip_both_in_place(Ct.contiguous());
  Ct = at::Tensor();
  G.div_(at::diag(G));  // G[j, k] = R[j, k] / R[k, k]
  if (in_place) {  // checked before the buffer changed (factor_ratios_finite)
    TORCH_INTERNAL_ASSERT(all_finite(G), "gptq: a factor checked finite gave a non-finite G");
    return G;
  }
  return all_finite(G) ? G : at::Tensor();
}

// t[p][:, p] (p[i] the row and column read for i) in t's own buffer: a contiguous square float
// CPU matrix, its rows moved along p's cycles through one spare row, then each row's columns
// gathered through it (Note [GPTQ's n x n buffers]).
void permute_both_in_place(at::Tensor& t, const std::vector<int64_t>& p) {
  const int64_t n = t.size(0);
  float* d = t.data_ptr<float>();
  std::vector<float> spare(static_cast<size_t>(n));
  std::vector<char> done(static_cast<size_t>(n), 0);
  const size_t row_bytes = static_cast<size_t>(n) * sizeof(float);
  for (int64_t s = 0; s < n; ++s) {
    if (done[s]) continue;
    std::memcpy(spare.data(), d + s * n, row_bytes);
    int64_t i = s;
    while (true) {
      done[i] = 1;
      const int64_t from = p[i];
      if (from == s) {
        std::memcpy(d + i * n, spare.data(), row_bytes);
        break;
      }
      std::memcpy(d + i * n, d + from * n, row_bytes);
      i = from;
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    float* row = d + r * n;
    for (int64_t k = 0; k < n; ++k) spare[k] = row[p[k]];
    std::memcpy(row, spare.data(), row_bytes);
  }
}

std::tuple<at::Tensor, at::Tensor> group_qparams(const at::Tensor& cols,
                                                 const llm::WeightGrid& g) {
  auto qp = llm::minmax_qparams(cols.amin(1), cols.amax(1), g);
  return {qp.first, qp.second};
}

// Note [GPTQ on the transposed weight]
// The column loop works on W^T ([in, out], in act order): a column of W is a contiguous row,
// the block's rank-one updates are updates of whole rows (out_f floats each), a group's
// current columns are rows col .. col + group_size, updated in place, and the block's update
// of the later columns is W^T[i2:] += G[i1:i2, i2:]^T E^T. One transpose of W in and one of Q
// out, where a row-major block ([out, block_size]) made a short update per row and, copied
// column-major for the kernel, four strided copies per block. The Python reference works on
// the same layout with the same ATen calls.
//
// Note [GPTQ column loop on the CPU]
// The column loop is GPTQ's sequential part: per column, a rounding, an error and a rank-one
// update of the block's columns left. As ATen ops that is a dozen dispatches per column, whose
// overhead outweighed the arithmetic on the decoder of docs/llm.md. On the CPU the column step
// runs in ops/cpu/gptq_kernel.cpp on whole vector registers, with the very float operations of
// the ATen sequence (1 / s, x * (1 / s), round half to even, + z, clamp, - z, * s, w0 - q,
// w += e * g; no contraction), so both give the same bits; other devices keep the ATen ops.
// A loop over the row-major block (a scalar rounding per element and a short update per row)
// took 18 of the op's 100 ms at 512 x 1536, one thread.

std::tuple<at::Tensor, at::Tensor, at::Tensor, double> quantize_weight_impl(
    const at::Tensor& weight, const at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size, double damp,
    bool act_order, c10::string_view name, bool consume) {
  const char* op = consume ? "gptq_quantize_weight_" : "gptq_quantize_weight";
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
  // Note [GPTQ's n x n buffers]: H is not copied; the dead inputs' diagonal (set to 1) is
  // applied to the diagonal read here and to Hr, the reordered copy the factorization takes
  auto H = hessian.detach().to(at::kFloat);
  const auto dead = at::diagonal(H) == 0;
  const auto diag_h = at::diag(H).masked_fill_(dead, 1.0);
  W.masked_fill_(dead.unsqueeze(0), 0.0);
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
  // Note [GPTQ on the transposed weight]: W^T in act order
  at::Tensor perm;
  std::vector<int64_t> perm_host;
  at::Tensor Hr;  // J H J (in act order): the order the factorization takes it in
  auto WT = W.t().contiguous();
  W = at::Tensor();  // Note [GPTQ's n x n buffers]
  // gptq_quantize_weight_ on the CPU: Hr made in the caller's H
  const bool in_place = consume && H.is_cpu() && H.is_contiguous() &&
                        H.scalar_type() == at::kFloat;
  if (act_order) {
    perm = at::argsort(diag_h, /*stable=*/false, /*dim=*/0, /*descending=*/true);
    WT = WT.index_select(0, perm);
    const auto rev = perm.flip({0});
    const auto perm_cpu = perm.to(at::kCPU).to(at::kLong).contiguous();
    perm_host.assign(perm_cpu.data_ptr<int64_t>(), perm_cpu.data_ptr<int64_t>() + n);
    if (in_place) {
      permute_both_in_place(H, std::vector<int64_t>(perm_host.rbegin(), perm_host.rend()));
      Hr = H;
    } else {
      auto rows = H.index_select(0, rev);
      Hr = rows.index_select(1, rev);
    }
    H = at::Tensor();  // Note [GPTQ's n x n buffers]
    at::diagonal(Hr).masked_fill_(dead.index_select(0, rev), 1.0);
  } else {
    Hr = in_place ? flip_both_in_place(H) : H.flip({0, 1});
    H = at::Tensor();  // Note [GPTQ's n x n buffers]
    at::diagonal(Hr).masked_fill_(dead.flip({0}), 1.0);
  }
  // at::diag (a contiguous copy), as the reference's torch.diag, in the columns' order: a mean
  // over the strided diagonal view or in another order sums differently, and one ulp of
  // damping moves roundings downstream
  const double mean_diag = at::mean(at::diag(Hr).flip({0})).item<double>();
  at::Tensor diag0;  // the LAPACK path factors Hr in its own buffer
  if (lapack_cholesky(Hr)) {
    if (!in_place) Hr = Hr.contiguous();
    upper_into_lower(Hr);
    diag0 = at::diag(Hr);
  }
  double rel = damp;
  at::Tensor G;  // Note [GPTQ from the factor of H]
  for (int t = 0; t < kMaxDampTries; ++t) {
    G = error_factor(Hr, diag0, rel * mean_diag);
    if (G.defined()) break;
    const double new_rel = rel > 0 ? rel * 10 : 1e-6;
    TORCH_WARN("gptq: the Hessian of ", name, " is not positive definite with damp=", rel,
               "; raising damp to ", new_rel);
    rel = new_rel;
  }
  TORCH_CHECK(G.defined(), op, ": the Hessian of ", name, " stays singular up to damp=", rel);
  Hr = at::Tensor();  // Note [GPTQ's n x n buffers]: G is all the column loop reads
  G = G.contiguous();

  auto W0T = WT.clone();  // the weight before any update: each column's error is w0 - q
  // Note [GPTQ's n x n buffers]: column j of Q is written where w0_j was, once read
  auto QT = W0T;
  const bool cpu = WT.is_cpu();
  const auto column = cpu ? cpu::gptq_column_stub.get() : nullptr;
  const bool one_scale = scale.size(0) == 1;
  // [groups, rows]: a group's scales contiguous, for the kernel
  auto scale_t = scale.t().contiguous(), zero_t = zero.t().contiguous();
  for (int64_t i1 = 0; i1 < n; i1 += block_size) {
    const int64_t i2 = std::min(i1 + block_size, n);
    auto ET = at::empty({i2 - i1, out_f}, fopts);  // the block's errors, a row per column
    for (int64_t col = i1; col < i2; ++col) {
      const int64_t orig = act_order ? perm_host[col] : col;
      const int64_t k = group_size > 0 ? orig / group_size : 0;
      if (group_size > 0 && !static_groups && col % group_size == 0) {
        // the group's grid from its columns as they are now (updated by earlier errors)
        auto qp = group_qparams(WT.slice(0, col, col + group_size).t(), g);
        scale.select(1, k).copy_(std::get<0>(qp));
        zero.select(1, k).copy_(std::get<1>(qp));
        scale_t.select(0, k).copy_(std::get<0>(qp));
        zero_t.select(0, k).copy_(std::get<1>(qp));
      }
      if (cpu) {  // Note [GPTQ column loop on the CPU]
        const int64_t qk = k * out_f;  // per tensor: k is 0 (scale_t is [1, 1])
        column({WT.data_ptr<float>() + col * out_f, QT.data_ptr<float>() + col * out_f,
                ET.data_ptr<float>() + (col - i1) * out_f, W0T.data_ptr<float>() + col * out_f,
                G.data_ptr<float>() + col * n + col, scale_t.data_ptr<float>() + qk,
                zero_t.data_ptr<float>() + qk, out_f, i2 - col - 1, one_scale,
                static_cast<float>(quant_min), static_cast<float>(quant_max)});
        continue;
      }
      const auto q = llm::fake_quant(WT.select(0, col), scale.select(1, k), zero.select(1, k), g);
      const auto e = W0T.select(0, col) - q;  // before q takes w0's place
      QT.select(0, col).copy_(q);
      WT.slice(0, col + 1, i2).add_(G.select(0, col).slice(0, col + 1, i2).unsqueeze(1) *
                                    e.unsqueeze(0));
      ET.select(0, col - i1).copy_(e);
    }
    if (i2 < n) {
      // in place: a product the size of the rows left would be the loop's largest buffer
      WT.slice(0, i2).addmm_(G.slice(0, i1, i2).slice(1, i2).t(), ET);
    }
  }
  // Note [GPTQ's n x n buffers]: the loop's buffers go before Q is made
  G = at::Tensor();
  WT = at::Tensor();
  W0T = at::Tensor();
  if (act_order) QT = QT.index_select(0, at::argsort(perm));
  auto Q = QT.t().contiguous();
  return {Q, scale, zero, rel};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, double> quantize_weight_functional_impl(
    const at::Tensor& weight, const at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size, double damp,
    bool act_order, c10::string_view name) {
  return quantize_weight_impl(weight, hessian, quant_min, quant_max, symmetric, per_channel,
                              group_size, block_size, damp, act_order, name, false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, double> quantize_weight_in_place_impl(
    const at::Tensor& weight, at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size, double damp,
    bool act_order, c10::string_view name) {
  return quantize_weight_impl(weight, hessian, quant_min, quant_max, symmetric, per_channel,
                              group_size, block_size, damp, act_order, name, true);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("gptq_hessian_update(Tensor H, Tensor x, int n_seen) -> Tensor");
  m.def("gptq_hessian_update_(Tensor(a!) H, Tensor x, int n_seen) -> Tensor(a!)");
  m.def("gptq_quantize_weight(Tensor weight, Tensor hessian, int quant_min, int quant_max, "
        "bool symmetric, bool per_channel, int group_size, int block_size=128, float damp=0.01, "
        "bool act_order=False, str name=\"layer\") -> (Tensor, Tensor, Tensor, float)");
  // the same, with the caller's hessian as the op's work space (its contents then unspecified)
  m.def("gptq_quantize_weight_(Tensor weight, Tensor(a!) hessian, int quant_min, int quant_max, "
        "bool symmetric, bool per_channel, int group_size, int block_size=128, float damp=0.01, "
        "bool act_order=False, str name=\"layer\") -> (Tensor, Tensor, Tensor, float)");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("gptq_hessian_update", TORCH_FN(hessian_update_impl));
  m.impl("gptq_hessian_update_", TORCH_FN(hessian_update_in_place_impl));
  m.impl("gptq_quantize_weight", TORCH_FN(quantize_weight_functional_impl));
  m.impl("gptq_quantize_weight_", TORCH_FN(quantize_weight_in_place_impl));
}

at::Tensor gptq_hessian_update(const at::Tensor& H, const at::Tensor& x, int64_t n_seen) {
  static auto op =
      detail::op_handle<decltype(gptq_hessian_update)>("mqbench::gptq_hessian_update");
  return op.call(H, x, n_seen);
}

at::Tensor& gptq_hessian_update_(at::Tensor& H, const at::Tensor& x, int64_t n_seen) {
  static auto op =
      detail::op_handle<decltype(gptq_hessian_update_)>("mqbench::gptq_hessian_update_");
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, double> gptq_quantize_weight_(
    const at::Tensor& weight, at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size, double damp,
    bool act_order, c10::string_view name) {
  static auto op =
      detail::op_handle<decltype(gptq_quantize_weight_)>("mqbench::gptq_quantize_weight_");
  return op.call(weight, hessian, quant_min, quant_max, symmetric, per_channel, group_size,
                 block_size, damp, act_order, name);
}

}  // namespace ops
}  // namespace mqbench
