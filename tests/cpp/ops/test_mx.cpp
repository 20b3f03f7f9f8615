// C++ API tests of the block-scaled formats (fake_quantize_mx, fake_quantize_nvfp4): the element
// rounding against torch's own float8_e4m3fn cast and the E2M1 grid written out, the FP6 grids
// (E2M3, E3M2) decoded from their codes, the E8M0 scale at its edges, NVFP4's two-level scale,
// and the straight-through gradient.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "mqbench/ops/fake_quantize_mx.h"
#include "mqbench/qconfig.h"

namespace {

namespace mo = mqbench::ops;

// One block of 32 whose amax (first element) sets the MX scale to 1 for `fmt`, followed by `v`.
torch::Tensor unit_scale_block(float amax, const std::vector<float>& v) {
  std::vector<float> b(32, 0.0f);
  b[0] = amax;
  for (size_t i = 0; i < v.size(); ++i) b[i + 1] = v[i];
  return torch::tensor(b);
}

TEST(MxOps, E4m3ElementsRoundLikeTorchsFloat8Cast) {
  // every positive E4M3 value, the midpoints between neighbours (ties) and points just off them
  auto grid = torch::arange(0, 0x7f, torch::kUInt8).view(torch::kFloat8_e4m3fn).to(torch::kFloat);
  auto lo = grid.slice(0, 0, -1), hi = grid.slice(0, 1);
  auto mid = (lo + hi) / 2;
  auto vals = torch::cat({grid, mid, torch::nextafter(mid, hi), torch::nextafter(mid, lo)});
  vals = torch::cat({vals, -vals});
  for (int64_t start = 0; start < vals.numel(); start += 31) {
    const auto part = vals.slice(0, start, std::min<int64_t>(start + 31, vals.numel()));
    std::vector<float> v(part.data_ptr<float>(), part.data_ptr<float>() + part.numel());
    auto x = unit_scale_block(300.0f, v);  // floor(log2(300)) - 8 = 0: X = 1
    auto y = mo::fake_quantize_mx(x, "mxfp8_e4m3");
    auto expected = x.to(torch::kFloat8_e4m3fn).to(torch::kFloat);
    ASSERT_TRUE(torch::equal(y, expected)) << "block starting at " << start;
  }
}

TEST(MxOps, E2m1ElementsRoundToNearestEven) {
  // amax 6: floor(log2(6)) - 2 = 0, X = 1. Ties go to the even mantissa.
  const std::vector<float> in = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 5.9f, 0.26f,
                                 -0.25f, -0.75f, -5.0f, -3.4f, 7.9f, 0.5f, 3.0f};
  const std::vector<float> out = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f, 0.5f,
                                  -0.0f, -1.0f, -4.0f, -3.0f, 6.0f, 0.5f, 3.0f};
  auto y = mo::fake_quantize_mx(unit_scale_block(6.0f, in), "mxfp4");
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(y[i + 1].item<float>(), out[i]) << "input " << in[i];
    EXPECT_EQ(std::signbit(y[i + 1].item<float>()), std::signbit(out[i])) << "input " << in[i];
  }
}

// The value of a non-negative FP6 code (5 bits: exponent, then mantissa) with `mbits` mantissa
// bits and exponent bias `bias` (OCP MX v1.0 section 5.3.2: no inf, no NaN).
float fp6_value(int code, int mbits, int bias) {
  const int e = code >> mbits, m = code & ((1 << mbits) - 1);
  const float frac = static_cast<float>(m) / static_cast<float>(1 << mbits);
  return e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0f + frac, e - bias);
}

TEST(MxOps, Fp6ElementsRoundToTheirGridTiesToEven) {
  struct Case {
    const char* fmt;
    int mbits, bias;
    float max;
  };
  for (const Case c : {Case{"mxfp6_e2m3", 3, 1, 7.5f}, Case{"mxfp6_e3m2", 2, 3, 28.0f}}) {
    std::vector<float> grid;
    for (int code = 0; code < 32; ++code) grid.push_back(fp6_value(code, c.mbits, c.bias));
    ASSERT_EQ(grid.back(), c.max) << c.fmt;
    // each code stays; the midpoint of codes k and k + 1 goes to the even one of the two
    for (int k = 0; k + 1 < 32; ++k) {
      const float mid = (grid[k] + grid[k + 1]) / 2;
      auto x = unit_scale_block(c.max, {grid[k], mid, -mid, std::nextafter(mid, 100.0f)});
      auto y = mo::fake_quantize_mx(x, c.fmt);
      const float even = grid[k % 2 == 0 ? k : k + 1];
      EXPECT_EQ(y[1].item<float>(), grid[k]) << c.fmt << " code " << k;
      EXPECT_EQ(y[2].item<float>(), even) << c.fmt << " tie " << k;
      EXPECT_EQ(y[3].item<float>(), -even) << c.fmt << " tie " << k;
      EXPECT_EQ(y[4].item<float>(), grid[k + 1]) << c.fmt << " above tie " << k;
    }
    // saturation: amax below 2^(emax + 1) keeps the scale 1; what is above max goes to max
    auto y = mo::fake_quantize_mx(unit_scale_block(std::nextafter(c.max, 100.0f), {-c.max}), c.fmt);
    EXPECT_EQ(y[0].item<float>(), c.max) << c.fmt;
    EXPECT_EQ(y[1].item<float>(), -c.max) << c.fmt;
  }
  // the shared scale: amax 1000 has floor(log2) 9; E2M3 (emax 2): X = 2^7, E3M2 (emax 4): X = 2^5
  auto x = unit_scale_block(1000.0f, {100.0f});
  auto y = mo::fake_quantize_mx(x, "mxfp6_e2m3");
  EXPECT_EQ(y[0].item<float>(), 7.5f * 128.0f);  // 7.8125 saturates
  EXPECT_EQ(y[1].item<float>(), 0.75f * 128.0f);  // 0.78125 -> 0.75
  y = mo::fake_quantize_mx(x, "mxfp6_e3m2");
  EXPECT_EQ(y[0].item<float>(), 28.0f * 32.0f);   // 31.25 saturates
  EXPECT_EQ(y[1].item<float>(), 3.0f * 32.0f);    // 3.125 -> 3
  EXPECT_THROW(mo::fake_quantize_mx(x, "mxfp6"), c10::Error);
}

TEST(MxOps, Fp6SchemesGiveTheCppMxFakeQuantize) {
  // get_qconfig picks MXFakeQuantize for an MXFP6 dtype; it is 6 bits wide and runs the op
  const auto x = torch::randn({8, 64}) * 3;
  for (const char* fmt : {"mxfp6_e3m2", "mxfp6_e2m3"}) {
    mqbench::ExtraQConfig extra;
    mqbench::QuantizeScheme s;
    s.dtype = fmt;
    s.bit = 6;
    extra.w_qscheme = extra.a_qscheme = s;
    extra.a_fakequantize = "FixedFakeQuantize";
    const auto q = mqbench::get_qconfig("Tensorrt", extra);
    EXPECT_EQ(q.weight.fake_quantize, "MXFakeQuantize") << fmt;
    EXPECT_EQ(q.activation.fake_quantize, "MXFakeQuantize") << fmt;
    auto a = q.activation();
    EXPECT_EQ(a->bitwidth, 6) << fmt;
    EXPECT_TRUE(torch::equal(a->forward(x), mo::fake_quantize_mx(x, fmt, 32, -1))) << fmt;
  }
  mqbench::QuantizeScheme wrong;
  wrong.dtype = "mxfp6_e2m3";
  wrong.bit = 8;
  EXPECT_THROW(wrong.validate(), std::exception);
}

TEST(MxOps, SharedScaleIsFloorLog2OfAmaxMinusEmax) {
  // amax 1000: floor(log2) = 9; E4M3: X = 2^1, E2M1: X = 2^7. 1000 / 2 = 500 saturates to 448.
  auto x = unit_scale_block(1000.0f, {3.0f, 130.0f});
  auto y8 = mo::fake_quantize_mx(x, "mxfp8_e4m3");
  EXPECT_EQ(y8[0].item<float>(), 896.0f);
  EXPECT_EQ(y8[1].item<float>(), 3.0f);  // 3 / 2 = 1.5, on the E4M3 grid
  auto y4 = mo::fake_quantize_mx(x, "mxfp4");
  EXPECT_EQ(y4[0].item<float>(), 768.0f);   // 1000 / 128 = 7.8 -> 6
  EXPECT_EQ(y4[2].item<float>(), 128.0f);   // 130 / 128 = 1.02 -> 1
  // all-zero block, NaN block, inf
  EXPECT_TRUE(torch::equal(mo::fake_quantize_mx(torch::zeros({32}), "mxfp4"), torch::zeros({32})));
  auto n = unit_scale_block(std::numeric_limits<float>::quiet_NaN(), {1.0f});
  EXPECT_TRUE(torch::isnan(mo::fake_quantize_mx(n, "mxfp8_e4m3")).all().item<bool>());
  auto i = unit_scale_block(std::numeric_limits<float>::infinity(), {1.0f});
  auto yi = mo::fake_quantize_mx(i, "mxfp8_e4m3");
  EXPECT_TRUE(std::isinf(yi[0].item<float>()));
  EXPECT_EQ(yi[1].item<float>(), 0.0f);
}

TEST(MxOps, Nvfp4TwoLevelScaleAndStraightThroughGradient) {
  // global amax 2688 -> g = 1; a block with amax 6 has the E4M3 scale 1: elements on the E2M1
  // grid stay; a block with amax 12 has scale 2.
  std::vector<float> v = {6.0f, 2.5f, 0.75f, -5.0f};
  v.resize(16, 0.0f);
  std::vector<float> w = {12.0f, 5.0f, 2.9f};
  w.resize(16, 0.0f);
  v.insert(v.end(), w.begin(), w.end());
  auto x = torch::tensor(v).requires_grad_();
  auto y = mo::fake_quantize_nvfp4(x, torch::tensor(2688.0f));
  EXPECT_EQ(y[1].item<float>(), 2.0f);
  EXPECT_EQ(y[2].item<float>(), 1.0f);
  EXPECT_EQ(y[3].item<float>(), -4.0f);
  EXPECT_EQ(y[16].item<float>(), 12.0f);
  EXPECT_EQ(y[17].item<float>(), 4.0f);   // 2.5 -> 2, times 2
  EXPECT_EQ(y[18].item<float>(), 3.0f);   // 1.45 -> 1.5, times 2
  y.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones_like(x)));
  EXPECT_THROW(mo::fake_quantize_nvfp4(x.detach(), torch::tensor(-1.0f)), c10::Error);
}

}  // namespace
