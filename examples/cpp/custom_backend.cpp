// A backend defined by a C++ application, outside the library: "MyNPU" (4-bit symmetric
// per-channel weights, 8-bit asymmetric activations clipped at a quantile of |x|), registered
// with MQBENCH_REGISTER_BACKEND and used through get_qconfig and the C++ fake quantizers.
// docs/add_a_backend.md walks through the same backend in Python.

#include <torch/torch.h>

#include <cstdio>

#include "mqbench/backend.h"
#include "mqbench/qconfig.h"

MQBENCH_REGISTER_BACKEND(my_npu, [] {
  mqbench::BackendSpec s;
  s.name = "MyNPU";
  s.weight_scheme = mqbench::QuantizeScheme{true, true, false, 4, true, {}};
  s.activation_scheme = mqbench::QuantizeScheme{false, false, false, 8, false,
                                                {{"threshold", 0.9999}, {"ema_ratio", 0.8}}};
  s.weight_fake_quantize = s.activation_fake_quantize = "LearnableFakeQuantize";
  s.weight_observer = "MinMaxObserver";
  s.activation_observer = "EMAQuantileObserver";
  return s;
}());

int main() {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  auto qconfig = mqbench::get_qconfig("MyNPU");
  auto w_fq = qconfig.weight();
  auto a_fq = qconfig.activation();
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 16, 3));
  const auto x = torch::randn({8, 3, 16, 16});
  for (int i = 0; i < 4; ++i) a_fq->forward(torch::relu(conv->forward(x)));  // calibration
  w_fq->forward(conv->weight);
  w_fq->disable_observer();
  a_fq->disable_observer();
  const auto y_float = torch::relu(conv->forward(x));
  const auto y_q = a_fq->forward(torch::relu(
      torch::conv2d(x, w_fq->forward(conv->weight), conv->bias)));
  const double err = ((y_q - y_float).abs().mean() / y_float.abs().mean()).item<double>();
  std::printf("MyNPU from C++: weights [%ld, %ld] per channel, activations [%ld, %ld]; "
              "relative mean error %.4f\n", static_cast<long>(w_fq->quant_min),
              static_cast<long>(w_fq->quant_max), static_cast<long>(a_fq->quant_min),
              static_cast<long>(a_fq->quant_max), err);
  if (!(err < 0.2)) {
    std::fprintf(stderr, "quantization error too large\n");
    return 1;
  }
  return 0;
}
