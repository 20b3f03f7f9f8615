#pragma once
// The trained layer of quantize_conv as plain numbers, and its ONNX export (conv_onnx.cpp).
// No torch and no protobuf types here: both halves of the example include it.

#include <cstdint>
#include <string>
#include <vector>

struct ConvLayer {
  std::vector<int64_t> weight_shape;  // [8, 3, 3, 3]
  std::vector<double> weight, bias;   // row-major weight, 8 biases
  std::vector<double> w_scale;        // per output channel
  double a_scale = 1.0;               // per tensor
  double x_scale = 1.0;               // the input's, per tensor ([-127, 127], fixed)
};

/// Serialized ONNX of the layer with mqbench's fake-quantize nodes (opset 13, padding 1,
/// input x [1, 3, 12, 12], output y).
std::string conv_onnx(const ConvLayer& layer);
