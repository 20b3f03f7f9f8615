#pragma once
// Fake-quantize nodes in an exported ONNX graph, and the passes that take them out (each pass is
// one file under src/deploy/passes/, named as the function: mqbench/deploy/pass.h).
//
// Recognised forms (docs/deploy.md lists them with their inputs and attributes):
//  * mqbench's own nodes, in the `mqbench` domain or (as MQBench 1.10 wrote them) the default
//    domain: FixedPerTensorAffine, LearnablePerTensorAffine, FixedPerChannelAffine,
//    FakeQuantizeLearnablePerchannelAffine, FakeQuantizeDSQPertensor/Perchannel,
//    FakeQuantizeTqtAffine, NNIEQuantize;
//  * QuantizeLinear [-> Clip] -> DequantizeLinear pairs, with or without MQBench main's
//    quant_min / quant_max attributes (without them the range comes from the Clip, else from the
//    zero point's type), and MQBench main's NNIE form (QuantizeLinear with a data_max attribute);
//  * the formats of docs/formats.md in their standard form: FP8 (a FLOAT8E4M3FN / FLOAT8E5M2
//    zero point or output_dtype, opset 19) and blocked integer Q/DQ (block_size, opset 21). Only
//    to_qdq writes them back (QDQ, Academic, Tensorrt's QDQ model); every pass that removes the
//    quantizers refuses them by name (refuse_format);
//  * the block-scaled formats (docs/formats-mx.md), whose block scales come from the data: the
//    `mqbench` domain's FakeQuantizeMXFP8 / FakeQuantizeMXFP4 (x) and FakeQuantizeNVFP4 (x,
//    global_amax), with attributes block_size, axis and blocked_shape. to_qdq writes them as
//    standard ONNX (src/deploy/block_formats.cpp), the other passes refuse them.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mqbench/deploy/onnx_graph.h"

namespace mqbench {
namespace deploy {

/// The element format of a group: MQBench's integers, FP8 (docs/formats.md), or a block-scaled
/// format (docs/formats-mx.md).
enum class QFormat { kInt, kFp8E4M3, kFp8E5M2, kMxfp8, kMxfp4, kNvfp4 };

struct QParams {
  std::vector<double> scale;         // one value per tensor, channel or block
  std::vector<int64_t> zero_point;   // integers in [quant_min, quant_max] (FP8: zeros)
  int64_t quant_min = 0, quant_max = 255;  // integer formats only
  int64_t axis = -1;                 // channel (or blocked) axis; -1 for per-tensor
  QFormat format = QFormat::kInt;
  bool saturate = true;              // FP8: QuantizeLinear's saturate attribute
  /// Blocked (group-wise) quantization: one scale per block_size consecutive elements along
  /// axis; scale_dims is the scale's shape (x's, with size(axis) / block_size there). 0: none.
  int64_t block_size = 0;
  std::vector<int64_t> scale_dims;
  /// MX / NVFP4 (data_scaled()): no scale here, each block's comes from its data. blocked_shape
  /// is the Reshape target that splits axis into [blocks, block_size] (0 copies a dimension,
  /// -1 infers one); tensor_amax is NVFP4's observed amax A (its tensor scale is A / 2688).
  std::vector<int64_t> blocked_shape;
  double tensor_amax = 0;
  bool per_channel() const { return axis >= 0; }
  bool blocked() const { return block_size > 0; }
  bool data_scaled() const {
    return format == QFormat::kMxfp8 || format == QFormat::kMxfp4 || format == QFormat::kNvfp4;
  }
  /// A format only to_qdq writes (FP8, blocked, MX, NVFP4); see refuse_format.
  bool is_format() const { return format != QFormat::kInt || blocked(); }
  /// "FP8 E4M3 per tensor", "group-wise int [-8, 7], block 32 on axis 1", ... for messages.
  std::string describe() const;
  /// log2(quant_max - quant_min + 1), as MQBench writes "bitwidth".
  int bit() const;
  /// s * (qmin - z) and s * (qmax - z) of channel c (wide integers: no uint8 wrap-around).
  double min_value(size_t c = 0) const;
  double max_value(size_t c = 0) const;
};

struct FakeQuant {
  std::string op_type;       // op type of the first node (QuantizeLinear, FixedPerTensorAffine...)
  std::string name;          // name of the first node
  std::vector<int> nodes;    // every node of the group (Q, Clip, DQ or the single custom node)
  std::string input;         // the float tensor that is fake-quantized
  std::string output;        // the fake-quantized tensor
  QParams q;
  bool nnie = false;         // NNIE's logarithmic quantizer: only data_max is meaningful
  double data_max = 0;
};

/// Whether `op_type` is one of MQBench's fake-quantize ops (the `mqbench` domain's ops).
bool is_fake_quant_op(const std::string& op_type);
/// Whether `op_type` is a block-scaled format's node (FakeQuantizeMXFP8, FakeQuantizeMXFP4,
/// FakeQuantizeNVFP4), which only the `mqbench` domain has.
bool is_block_format_op(const std::string& op_type);

/// Raises DeployError when `fq` is in a format (FP8, blocked) that `backend` does not deploy:
/// the passes that remove quantizers (remove_fake_quant, the OpenVINO translator) call it; the
/// message names the quantizer, its format and the backends that deploy it.
void refuse_format(const FakeQuant& fq, const std::string& backend);

/// Every fake-quantize group of `g`, in node order. Raises DeployError naming the node when a
/// group's parameters are not constants or are inconsistent.
std::vector<FakeQuant> find_fake_quants(const OnnxGraph& g);

enum class Role { kActivation, kWeight, kBias };
const char* role_name(Role r);

/// What remove_fake_quant took out: the group, its role, the tensor whose range it gives
/// (the group's input) and, for weights and biases, the node that consumes them.
struct Removed {
  FakeQuant fq;
  Role role = Role::kActivation;
  std::string tensor;
  std::string consumer;      // consumer node name (weights and biases)
  std::string consumer_op;
};

struct RemoveOptions {
  /// Clip weight initializers to their quantization range (MQBench's linear backends do).
  bool clip_weights = true;
  /// Where per-channel quantization is refused, the message to raise (empty: allowed).
  std::string per_channel_error;
  /// MQBench allows a fake-quantized bias only for Vitis.
  bool allow_bias = false;
  /// NNIE's logarithmic quantizer (only data_max, no scale or zero point) is meaningful to the
  /// NNIE translator alone; every other backend gets a DeployError naming the node.
  bool allow_nnie = false;
  /// The backend name, for messages.
  std::string backend;
};

/// MQBench's role rule: per-channel groups and per-tensor groups whose only consumer takes them
/// at input 1 of a Conv / Gemm / ConvTranspose are weights; at input 2, biases; the rest are
/// activations.
Role classify(const OnnxGraph& g, const FakeQuant& fq, std::string* consumer = nullptr,
              std::string* consumer_op = nullptr);

/// Clips the initializer `name` (a weight) to the range `q` quantizes to, [(qmin - z) s,
/// (qmax - z) s], per channel along q.axis; a tensor that is not an initializer (a computed
/// weight) is left as the graph computes it.
void clip_weight(OnnxGraph& g, const std::string& name, const QParams& q);

/// Removes every fake-quantize group, rewiring consumers to the float tensor; a fake-quantized
/// graph output is renamed back to the original tensor's name, as MQBench does. Weights are
/// clipped (per channel along the group's axis) when `clip_weights`.
std::vector<Removed> remove_fake_quant(OnnxGraph& g, const RemoveOptions& options);

/// Removes Pad nodes whose pads are all zero (MQBench's remove_fake_pad_op); returns whether
/// any went.
bool remove_zero_pads(OnnxGraph& g);

/// Replaces every Resize by Upsample(X, scales) with its mode (NNIE's toolchain; MQBench's
/// replace_resize_op_with_upsample). A Resize without constant scales is a DeployError. Returns
/// whether there was a Resize.
bool resize_to_upsample(OnnxGraph& g);

/// MQBench's post_process_clip_ranges: for each Flatten / Resize / Reshape node whose input has
/// no range (not in `has`), the range found downstream (its output, or further through such
/// nodes) is copied to that input. Returns the (to, from) pairs, in the order to copy them.
std::vector<std::pair<std::string, std::string>> post_process_clip_ranges(
    const OnnxGraph& g, std::set<std::string> has);

/// A layer with a quantized weight and a float input (find_float_layers).
struct FloatLayer {
  std::string node;     // the layer's node name
  std::string op_type;  // Conv, ConvTranspose, Gemm or MatMul
  std::string weight;   // the tensor its weight quantizer quantizes (the initializer's name)
};

/// The layers of the fake-quantized graph `g` that TensorRT would run in float: a Conv /
/// ConvTranspose / Gemm (weight at input 1) or MatMul (a constant weight, directly or through a
/// Transpose) whose weight has an integer fake quantizer, but whose data input has no activation
/// quantizer upstream, looking back through Identity, Flatten, Reshape, Transpose, Squeeze,
/// Unsqueeze, MaxPool and Pad (Note [Float layers] in src/deploy/passes/find_float_layers.cpp).
/// Weights in a format (FP8, group-wise, MX, NVFP4) are left out: TensorRT runs group-wise INT4
/// weights on float inputs by design (weight-only quantization). With `convolutions` false, only
/// Gemm and MatMul layers (Tensorrt_NLP, whose scheme quantizes the inputs of linear layers and
/// never a convolution's). In node order; an analysis, the graph is not changed.
std::vector<FloatLayer> find_float_layers(const OnnxGraph& g, bool convolutions = true);

struct QdqOptions {
  /// Tensorrt's deploy_to_qlinear: only 8-bit symmetric (zero point 0) is allowed; group-wise
  /// weights become INT4 initializers read by a DequantizeLinear (TensorRT's INT4 weight form).
  bool tensorrt = false;
  /// Names: "<group>_quantized" / "<group>_dequantized" (MQBench's ONNXQLinearPass) when true.
  bool qlinear_names = false;
  /// ONNX_QNN: every range must be 8-bit (qmax - qmin == 255) and is written as uint8 with zero
  /// point z - qmin (symmetric int8 becomes asymmetric uint8, MQBench's format_qlinear_dtype_pass).
  bool uint8 = false;
  std::string backend;
};

/// Replaces every fake-quantize group by a standard QuantizeLinear [-> Clip] -> DequantizeLinear
/// pair with constant FLOAT scales and INT8 / UINT8 zero points (opset 13). Ranges that fit
/// neither type raise DeployError naming the node. The formats keep theirs (opset 19 / 21); an
/// MX / NVFP4 weight becomes its codes and block scales as initializers read by
/// DequantizeLinear, an MX / NVFP4 activation the graph that computes its block scales (opset
/// 21 / 23; block_formats.cpp). Returns whether there was a group.
bool to_qdq(OnnxGraph& g, const QdqOptions& options);

}  // namespace deploy
}  // namespace mqbench
