// Quantization-aware training of one conv layer from C++, with no Python: the input goes through
// a fixed per-tensor fake quantizer (TensorRT runs a conv in INT8 only when its input is
// quantized too), the weight through per-channel LSQ fake quantization (learnable scales), the
// activation through per-tensor LSQ, and a few SGD steps fit the layer to a float target. Then
// the trained layer is written as ONNX with mqbench's fake-quantize nodes and deployed for TensorRT
// (conv_deploy_model.onnx, conv_clip_ranges.json, conv_calib.cache, onnx_quantized_model.onnx).
//
//   quantize_conv [OUTPUT_DIR]      (default: ./quantize_conv_out)

#include <torch/torch.h>

#include <cstdio>

#include "mqbench/config.h"
#include "mqbench/deploy/deploy.h"
#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/version.h"

#include "conv_onnx.h"

namespace {

namespace dep = mqbench::deploy;

std::vector<double> values(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

}  // namespace

int main(int argc, char** argv) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  torch::nn::Conv2d teacher(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  const auto x = torch::randn({16, 3, 12, 12});
  const auto target = teacher->forward(x).detach();

  // The input's range, calibrated once on the data (min-max), as the Tensorrt scheme's [-127, 127].
  const auto x_scale = torch::full({1}, (x.abs().max() / 127).item<float>());
  const auto xq =
      mqbench::ops::fake_quantize_per_tensor_affine(x, x_scale, torch::zeros({1}), -127, 127);
  // Symmetric 8-bit weights ([-127, 127], per output channel) and activations ([-128, 127]).
  const auto w_absmax = std::get<0>(conv->weight.detach().abs().flatten(1).max(1));
  auto w_scale = (w_absmax / 127).clone().requires_grad_();
  auto w_zp = torch::zeros({8});
  auto a_scale = torch::full({1}, (target.abs().max() / 127).item<float>()).requires_grad_();
  auto a_zp = torch::zeros({1});

  std::vector<torch::Tensor> params = conv->parameters();
  params.push_back(w_scale);
  params.push_back(a_scale);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.05));

  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    const double w_grad_factor = 1.0 / std::sqrt(conv->weight[0].numel() * 127.0);
    auto w = mqbench::ops::fake_quantize_learnable_per_channel_affine(conv->weight, w_scale, w_zp,
                                                                      0, -127, 127, w_grad_factor);
    auto y = torch::conv2d(xq, w, conv->bias, 1, 1);
    y = mqbench::ops::fake_quantize_learnable_per_tensor_affine(
        y, a_scale, a_zp, -128, 127, 1.0 / std::sqrt(y.numel() * 127.0));
    auto loss = torch::mse_loss(y, target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    {
      // As MQBench's LearnableFakeQuantize: keep learned scales positive (|s|, at least eps).
      torch::NoGradGuard no_grad;
      w_scale.abs_().clamp_min_(1.1920929e-07);
      a_scale.abs_().clamp_min_(1.1920929e-07);
    }
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  std::printf("mqbench %s (%s kernels): QAT loss %.4f -> %.4f\n", mqbench::version(),
              mqbench::cpu_capability(), first, last);
  if (!(last < first)) {
    std::fprintf(stderr, "QAT did not reduce the loss\n");
    return 1;
  }

  // Deploy the trained layer for TensorRT, exactly as mqbench-deploy would.
  dep::DeployOptions options;
  options.model_name = "conv";
  options.output_dir = argc > 1 ? argv[1] : "quantize_conv_out";
  options.deploy_to_qlinear = true;
  try {
    ConvLayer layer{conv->weight.sizes().vec(), values(conv->weight), values(conv->bias),
                    values(w_scale), values(a_scale)[0], values(x_scale)[0]};
    const auto model = conv_onnx(layer);
    for (const auto& path : dep::deploy(model, "Tensorrt", options)) std::printf("wrote %s\n", path.c_str());
  } catch (const dep::DeployError& e) {
    std::fprintf(stderr, "deploy failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
