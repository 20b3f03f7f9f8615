// to_qdq: every fake-quantize group becomes a standard QuantizeLinear [-> Clip] ->
// DequantizeLinear pair with constant scales and INT8 / UINT8 zero points (opset 13); FP8 groups
// keep their float8 zero points (opset 19), blocked groups their block_size (opset 21); MX and
// NVFP4 groups are written by block_formats.cpp (opset 21 / 23).

#include "mqbench/deploy/fake_quant.h"

#include <algorithm>
#include <cmath>

#include "deploy/block_formats.h"
#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {

namespace {

// What one group becomes: zero point type and values, scale shape, Q/DQ attributes, and the
// integer Clip range between them (none when the type's range is the group's).
struct QdqForm {
  int32_t type = onnx::TensorProto::UINT8;
  std::vector<int64_t> dims;         // of the scale and the zero point
  std::vector<double> zero_point;
  std::vector<onnx::AttributeProto> q_attrs, dq_attrs;
  bool clip = false;
  int64_t clip_min = 0, clip_max = 0;
  int64_t opset = 13;
};

// UINT8 for ranges in [0, 255], else INT8 for ranges in [-128, 127], with the type's range.
int32_t int_type(const std::string& name, const QParams& q, int64_t* lo, int64_t* hi) {
  if (q.quant_min >= 0 && q.quant_max <= 255) {
    *lo = 0; *hi = 255;
    return onnx::TensorProto::UINT8;
  }
  if (q.quant_min >= -128 && q.quant_max <= 127) {
    *lo = -128; *hi = 127;
    return onnx::TensorProto::INT8;
  }
  throw DeployError("fake quantizer '" + name + "': the range [" + std::to_string(q.quant_min) +
                    ", " + std::to_string(q.quant_max) + "] fits neither int8 nor uint8, so "
                    "it has no QuantizeLinear / DequantizeLinear form");
}

// FP8 (opset 19) and blocked integer (opset 21) groups, as the Python exporters write them
// (python/mqbench/onnx/formats.py): their own zero point types and attributes.
QdqForm format_form(const FakeQuant& fq, const QdqOptions& options) {
  const QParams& q = fq.q;
  if (options.uint8) refuse_format(fq, options.backend);
  QdqForm f;
  if (q.format != QFormat::kInt) {
    f.type = q.format == QFormat::kFp8E5M2 ? onnx::TensorProto::FLOAT8E5M2
                                            : onnx::TensorProto::FLOAT8E4M3FN;
    f.opset = 19;
    if (q.per_channel()) f.dims = {static_cast<int64_t>(q.scale.size())};
    f.zero_point.assign(q.scale.size(), 0.0);
    if (q.per_channel()) f.q_attrs.push_back(make_int_attribute("axis", q.axis));
    f.dq_attrs = f.q_attrs;
    f.q_attrs.push_back(make_int_attribute("saturate", q.saturate ? 1 : 0));
    return f;
  }
  int64_t lo, hi;
  f.type = int_type(fq.name, q, &lo, &hi);
  // A narrower range (INT4's [-8, 7]) saturates exactly through an integer Clip.
  f.clip = q.quant_min != lo || q.quant_max != hi;
  f.clip_min = q.quant_min;
  f.clip_max = q.quant_max;
  f.opset = 21;
  f.dims = q.scale_dims;
  f.zero_point.assign(q.zero_point.begin(), q.zero_point.end());
  f.q_attrs = {make_int_attribute("axis", q.axis), make_int_attribute("block_size", q.block_size)};
  f.dq_attrs = f.q_attrs;
  return f;
}

// TensorRT's form of a group-wise weight: its integers as an INT4 initializer read by a
// DequantizeLinear (axis, block_size; opset 21). TensorRT's dequantize layer takes a constant INT4
// input and no zero point but 0. The integers are computed with the fake-quant op's formula
// (Note [Zero point modes] in src/ops/common/affine_formula.h: nearbyint(x * float32(1 / s)) in
// float32, clamped), so they are the ones training used, not QuantizeLinear's x / s, which can
// round a value on a half-step boundary the other way.
onnx::NodeProto int4_weight(OnnxGraph& g, const FakeQuant& fq, const QdqOptions& options) {
  const QParams& q = fq.q;
  auto refuse = [&](const std::string& why) {
    return DeployError("fake quantizer '" + fq.name + "' is " + q.describe() + "; TensorRT reads "
                       "group-wise quantization only as INT4 weights (" + why + "): deploy it "
                       "with BackendType.QDQ or Academic (docs/formats.md)");
  };
  const auto* w = g.initializer(fq.input);
  if (!w) throw refuse("'" + fq.input + "' is not a weight initializer");
  if (q.quant_min < -8 || q.quant_max > 7) throw refuse("its range does not fit [-8, 7]");
  if (std::any_of(q.zero_point.begin(), q.zero_point.end(), [](int64_t z) { return z != 0; })) {
    throw refuse("TensorRT takes zero points of 0 only");
  }
  const ConstTensor c = to_const(*w);
  const auto axis = static_cast<size_t>(q.axis);
  int64_t inner = 1;
  for (size_t d = axis + 1; d < c.dims.size(); ++d) inner *= c.dims[d];
  const int64_t channels = c.dims.at(axis), blocks = channels / q.block_size;
  std::vector<double> ints(c.values.size());
  for (size_t e = 0; e < c.values.size(); ++e) {
    const int64_t i = static_cast<int64_t>(e);
    const int64_t outer = i / (inner * channels), ch = (i / inner) % channels;
    const size_t k = static_cast<size_t>((outer * blocks + ch / q.block_size) * inner + i % inner);
    const float inv = 1.0f / static_cast<float>(q.scale[k]);
    const float v = std::nearbyint(static_cast<float>(c.values[e]) * inv);
    // NaN weights (a broken checkpoint) would have no integer: refused by make_tensor
    const double lo = static_cast<double>(q.quant_min), hi = static_cast<double>(q.quant_max);
    ints[e] = std::isnan(v) ? v : std::min(std::max(static_cast<double>(v), lo), hi);
  }
  const std::string base = fq.input;
  const std::string w_name = g.unique_name(base + "_int4");
  const std::string s_name = g.unique_name(base + "_scale");
  g.set_initializer(make_tensor(w_name, onnx::TensorProto::INT4, c.dims, ints));
  g.set_initializer(make_tensor(s_name, onnx::TensorProto::FLOAT, q.scale_dims, q.scale));
  onnx::NodeProto dq;
  dq.set_op_type("DequantizeLinear");
  dq.set_name(g.unique_name(options.qlinear_names ? fq.name + "_dequantized" : fq.name + "_dq"));
  dq.add_input(w_name);
  dq.add_input(s_name);
  dq.add_output(fq.output);
  *dq.add_attribute() = make_int_attribute("axis", q.axis);
  *dq.add_attribute() = make_int_attribute("block_size", q.block_size);
  return dq;
}

// MQBench's integer groups (opset 13).
QdqForm int_form(const FakeQuant& fq, const QdqOptions& options, OnnxGraph& g) {
  QParams q = fq.q;
  if (options.uint8) {
    if (q.quant_max - q.quant_min != 255) {
      throw DeployError("fake quantizer '" + fq.name + "' is not 8-bit ([" + std::to_string(q.quant_min) +
                        ", " + std::to_string(q.quant_max) + "]); " + options.backend +
                        " deploys 8-bit quantization only");
    }
    for (auto& z : q.zero_point) z -= q.quant_min;
    q.quant_max -= q.quant_min;
    q.quant_min = 0;
  }
  QdqForm f;
  int64_t lo, hi;
  f.type = int_type(fq.name, q, &lo, &hi);
  if (options.tensorrt) {
    const auto span = q.quant_max - q.quant_min;
    if (span != 254 && span != 255) {
      throw DeployError("fake quantizer '" + fq.name + "' is " + std::to_string(q.bit()) +
                        "-bit; TensorRT's QDQ model supports 8-bit quantization only");
    }
    if (std::any_of(q.zero_point.begin(), q.zero_point.end(), [](int64_t z) { return z != 0; })) {
      throw DeployError("fake quantizer '" + fq.name + "' has a non-zero zero point; TensorRT "
                        "supports symmetric quantization only");
    }
  }
  if (q.per_channel()) f.dims = {static_cast<int64_t>(q.scale.size())};
  f.zero_point.assign(q.zero_point.begin(), q.zero_point.end());
  if (q.per_channel()) f.q_attrs.push_back(make_int_attribute("axis", q.axis));
  f.dq_attrs = f.q_attrs;
  // A narrower range saturates exactly through an integer Clip; TensorRT's QDQ has none (it
  // takes [-127, 127] as int8, as MQBench's ONNXQLinearPass writes it). There a weight is
  // clipped to the narrow range instead, so a weight that training clipped to -127 s is not
  // quantized to -128 s; an activation below -127.5 s still reaches -128 s (TensorRT's
  // int8), one level past what training computed (docs/compatibility.md row 137).
  const bool narrow = q.quant_min != lo || q.quant_max != hi;
  if (narrow && options.tensorrt) clip_weight(g, fq.input, fq.q);
  f.clip = narrow && !options.tensorrt;
  f.clip_min = q.quant_min;
  f.clip_max = q.quant_max;
  return f;
}

}  // namespace

bool to_qdq(OnnxGraph& g, const QdqOptions& options) {
  const PassScope scope("to_qdq", g);
  const auto fqs = find_fake_quants(g);
  std::set<int> dead;
  std::vector<onnx::NodeProto> added;
  int64_t opset = 13;
  for (const auto& fq : fqs) {
    if (fq.nnie) {
      throw DeployError("fake quantizer '" + fq.name + "' is NNIE's logarithmic quantizer, which "
                        "has no QuantizeLinear form");
    }
    if (fq.q.data_scaled()) {  // MX, NVFP4: block_formats.cpp
      if (options.uint8) refuse_format(fq, options.backend);
      opset = std::max(opset, block_format_qdq(g, fq, options.tensorrt, options.qlinear_names,
                                                    &added));
      dead.insert(fq.nodes.begin(), fq.nodes.end());
      continue;
    }
    if (options.tensorrt && fq.q.blocked()) {
      added.push_back(int4_weight(g, fq, options));
      dead.insert(fq.nodes.begin(), fq.nodes.end());
      opset = std::max<int64_t>(opset, 21);
      continue;
    }
    const QdqForm f = fq.q.is_format() ? format_form(fq, options) : int_form(fq, options, g);
    opset = std::max(opset, f.opset);
    const std::string base = fq.input;
    const std::string s_name = g.unique_name(base + "_scale");
    const std::string z_name = g.unique_name(base + "_zero_point");
    g.set_initializer(make_tensor(s_name, onnx::TensorProto::FLOAT, f.dims, fq.q.scale));
    g.set_initializer(make_tensor(z_name, f.type, f.dims, f.zero_point));
    const std::string q_out = g.unique_name(base + "_quantized");
    onnx::NodeProto qn, dqn;
    qn.set_op_type("QuantizeLinear");
    qn.set_name(g.unique_name(options.qlinear_names ? fq.name + "_quantized" : fq.name));
    qn.add_input(fq.input);
    qn.add_input(s_name);
    qn.add_input(z_name);
    qn.add_output(q_out);
    for (const auto& a : f.q_attrs) *qn.add_attribute() = a;
    added.push_back(qn);
    std::string dq_in = q_out;
    if (f.clip) {
      const std::string mn = g.unique_name(base + "_qmin"), mx = g.unique_name(base + "_qmax");
      g.set_initializer(make_tensor(mn, f.type, {}, {static_cast<double>(f.clip_min)}));
      g.set_initializer(make_tensor(mx, f.type, {}, {static_cast<double>(f.clip_max)}));
      onnx::NodeProto clip;
      clip.set_op_type("Clip");
      clip.set_name(g.unique_name(fq.name + "_clip"));
      clip.add_input(q_out);
      clip.add_input(mn);
      clip.add_input(mx);
      dq_in = g.unique_name(base + "_clipped");
      clip.add_output(dq_in);
      added.push_back(clip);
    }
    dqn.set_op_type("DequantizeLinear");
    dqn.set_name(g.unique_name(options.qlinear_names ? fq.name + "_dequantized" : fq.name + "_dq"));
    dqn.add_input(dq_in);
    dqn.add_input(s_name);
    dqn.add_input(z_name);
    dqn.add_output(fq.output);
    for (const auto& a : f.dq_attrs) *dqn.add_attribute() = a;
    added.push_back(dqn);
    dead.insert(fq.nodes.begin(), fq.nodes.end());
  }
  g.replace_nodes(dead, std::move(added));  // old groups out, new nodes in, sorted
  if (g.opset("") < opset) g.set_opset("", opset);
  // Our own domain is no longer used.
  g.drop_opset("mqbench");
  return !fqs.empty();
}

MQBENCH_REGISTER_DEPLOY_PASS(to_qdq, "to_qdq",
                             "rewrites every fake-quantize group as QuantizeLinear [-> Clip] -> "
                             "DequantizeLinear (default QdqOptions)",
                             [](OnnxGraph& g) { return PassResult{to_qdq(g, QdqOptions{}), ""}; });

}  // namespace deploy
}  // namespace mqbench
