// MX and NVFP4 groups as standard ONNX (block_formats.h; docs/design/formats.md).
//
// A weight is quantized here with the kernels' formulas (ops/common/mx_formula.h, torch-free),
// so its codes and scales are the ones the fake-quant op computes, bit for bit:
//   MX:    codes = round_elem(w * 2^-e) (FLOAT8E4M3FN / FLOAT4E2M1), scale = 2^e (FLOAT);
//          DequantizeLinear(codes, scale, axis, block_size)
//   NVFP4: codes = round_e2m1(w * ((1 / g) / s)), s the E4M3 block scale, g = A / 2688;
//          DequantizeLinear(codes, DequantizeLinear(s, g), axis, block_size)
// An activation's block scales are computed in the graph from its data: the nodes of
// python/mqbench/onnx/mx.py's "qdq" export (its docstring derives them).

#include "deploy/block_formats.h"

#include <algorithm>
#include <cmath>

#include "ops/common/mx_formula.h"

namespace mqbench {
namespace deploy {
namespace {

namespace mx = ops::detail;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

// Appends nodes (and their constants) that compute one group's output.
struct Writer {
  OnnxGraph& g;
  std::vector<onnx::NodeProto>* added;
  std::string base;  // the group's input: every name starts with it
  std::string name_prefix;

  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const std::vector<onnx::AttributeProto>& attrs = {}, std::string out = {}) {
    onnx::NodeProto n;
    n.set_op_type(op);
    n.set_name(g.unique_name(name_prefix + "_" + op));
    for (const auto& i : inputs) n.add_input(i);
    if (out.empty()) out = g.unique_name(base + "_" + op);
    n.add_output(out);
    for (const auto& a : attrs) *n.add_attribute() = a;
    added->push_back(std::move(n));
    return out;
  }
  std::string constant(const std::string& what, int32_t type, const std::vector<int64_t>& dims,
                       const std::vector<double>& values) {
    const std::string name = g.unique_name(base + "_" + what);
    g.set_initializer(make_tensor(name, type, dims, values));
    return name;
  }
  std::string f(double v) { return constant("c", kFloat, {}, {v}); }
};

int32_t element_type(QFormat format) {
  return format == QFormat::kMxfp8 ? onnx::TensorProto::FLOAT8E4M3FN
                                   : onnx::TensorProto::FLOAT4E2M1;
}

std::vector<onnx::AttributeProto> block_attrs(const QParams& q) {
  return {make_int_attribute("axis", q.axis), make_int_attribute("block_size", q.block_size)};
}

// The weight's codes and scales, per block; see the file comment.
void weight(Writer& w, const FakeQuant& fq, const onnx::TensorProto& init) {
  const QParams& q = fq.q;
  const ConstTensor c = to_const(init);
  const auto axis = static_cast<size_t>(q.axis);
  int64_t inner = 1;
  for (size_t d = axis + 1; d < c.dims.size(); ++d) inner *= c.dims[d];
  const int64_t channels = c.dims.at(axis), blocks = channels / q.block_size;
  std::vector<int64_t> scale_dims = c.dims;
  scale_dims[axis] = blocks;
  const auto block_of = [&](size_t e) {
    const int64_t i = static_cast<int64_t>(e);
    const int64_t outer = i / (inner * channels), ch = (i / inner) % channels;
    return static_cast<size_t>((outer * blocks + ch / q.block_size) * inner + i % inner);
  };
  std::vector<uint32_t> amax(c.values.size() / static_cast<size_t>(q.block_size), 0);
  for (size_t e = 0; e < c.values.size(); ++e) {
    const auto v = static_cast<float>(c.values[e]);
    if (!std::isfinite(v)) {  // a NaN block is NaN, an inf one saturates: no weight to deploy
      throw DeployError("fake quantizer '" + fq.name + "': weight '" + fq.input + "' holds " +
                        (std::isnan(v) ? "NaN" : "an infinity") + " at index " +
                        std::to_string(e) + ", which " + q.describe() + " cannot encode");
    }
    uint32_t& a = amax[block_of(e)];
    a = std::max(a, mx::abs_bits(v));
  }
  const float gs = mx::nvfp4_global_scale(static_cast<float>(q.tensor_amax));
  std::vector<mx::BlockScale> scale(amax.size());
  std::vector<double> scale_values(amax.size());
  for (size_t k = 0; k < amax.size(); ++k) {
    if (q.format == QFormat::kMxfp8) {
      scale[k] = mx::mx_block_scale<mx::E4M3>(amax[k]);
    } else if (q.format == QFormat::kMxfp4) {
      scale[k] = mx::mx_block_scale<mx::E2M1>(amax[k]);
    } else {
      scale[k] = mx::nvfp4_block_scale(mx::bits_float(amax[k]), gs);
    }
    scale_values[k] = q.format == QFormat::kNvfp4
                          ? mx::nvfp4_block_e4m3(mx::bits_float(amax[k]), gs)
                          : scale[k].scale;
  }
  std::vector<double> codes(c.values.size());
  for (size_t e = 0; e < c.values.size(); ++e) {
    const float x = static_cast<float>(c.values[e]) * scale[block_of(e)].mul;
    codes[e] = q.format == QFormat::kMxfp8 ? mx::round_to_format<mx::E4M3>(x)
                                           : mx::round_to_format<mx::E2M1>(x);
  }
  const int32_t type = element_type(q.format);
  const std::string codes_name = w.constant(
      type == onnx::TensorProto::FLOAT4E2M1 ? "fp4" : "fp8", type, c.dims, codes);
  std::string s;
  if (q.format == QFormat::kNvfp4) {  // TensorRT's first DequantizeLinear: s * g
    const std::string s8 = w.constant("block_scale", onnx::TensorProto::FLOAT8E4M3FN,
                                      scale_dims, scale_values);
    s = w.node("DequantizeLinear", {s8, w.constant("tensor_scale", kFloat, {}, {gs})});
  } else {
    s = w.constant("scale", kFloat, scale_dims, scale_values);
  }
  w.node("DequantizeLinear", {codes_name, s}, block_attrs(q), fq.output);
}

// floor(log2(a)) exactly: Floor(Log(a) / ln 2), moved by one where the float logarithm landed on
// the wrong side of a power of two.
std::string floor_log2(Writer& w, const std::string& a) {
  const std::string two = w.f(2.0), one = w.f(1.0);
  std::string e = w.node("Floor", {w.node("Div", {w.node("Log", {a}), w.f(std::log(2.0))})});
  const std::string up = w.node("Add", {e, one});
  e = w.node("Where", {w.node("LessOrEqual", {w.node("Pow", {two, up}), a}), up, e});
  const std::string down = w.node("Sub", {e, one});
  return w.node("Where", {w.node("Greater", {w.node("Pow", {two, e}), a}), down, e});
}

// The activation's block amax, NaN for a block holding a NaN (ReduceMax may skip NaN).
std::string block_amax(Writer& w, const FakeQuant& fq) {
  const QParams& q = fq.q;
  const std::string split = w.constant("blocked_shape", onnx::TensorProto::INT64,
                                       {static_cast<int64_t>(q.blocked_shape.size())},
                                       {q.blocked_shape.begin(), q.blocked_shape.end()});
  const std::string red = w.constant("block_axis", onnx::TensorProto::INT64, {1},
                                     {static_cast<double>(q.axis + 1)});
  const std::vector<onnx::AttributeProto> flat = {make_int_attribute("keepdims", 0)};
  const std::string amax =
      w.node("ReduceMax", {w.node("Reshape", {w.node("Abs", {fq.input}), split}), red}, flat);
  const std::string is_nan = w.node("IsNaN", {w.node("Reshape", {fq.input, split})});
  const std::string nan_in = w.node("Cast", {is_nan}, {make_int_attribute("to", kFloat)});
  const std::string nan = w.node("ReduceMax", {nan_in, red}, flat);
  return w.node("Where", {w.node("Greater", {nan, w.f(0.0)}), w.f(std::nan("")), amax});
}

// TensorRT's form of an activation along its last axis (as modelopt exports it; TensorRT's ONNX
// parser maps these ops to its dynamic-quantize layers): NVFP4 is trt::TRT_FP4DynamicQuantize(x,
// g) -> (FP4 codes, E4M3 block scales), then the two DequantizeLinear of a weight; MXFP8 is
// trt::TRT_MXFP8DynamicQuantize(x) -> (FP8 codes, E8M0 scales as uint8) ->
// trt::TRT_MXFP8DequantizeLinear. False (nothing written) for MXFP4, which TensorRT quantizes
// dynamically not at all, and for a block axis that is not the last.
bool tensorrt_activation(Writer& w, const FakeQuant& fq) {
  const QParams& q = fq.q;
  const auto last = static_cast<int64_t>(q.blocked_shape.size()) - 2;
  if (q.format == QFormat::kMxfp4 || q.axis != last) return false;
  const auto out2 = [&](const std::string& op, std::vector<std::string> inputs,
                        std::vector<onnx::AttributeProto> attrs) {
    const std::string codes = w.node(op, inputs, attrs);
    auto& n = w.added->back();
    n.set_domain("trt");
    const std::string scales = w.g.unique_name(w.base + "_" + op + "_scales");
    n.add_output(scales);
    return std::make_pair(codes, scales);
  };
  auto attrs = block_attrs(q);
  if (q.format == QFormat::kNvfp4) {
    const std::string gs = w.f(mx::nvfp4_global_scale(static_cast<float>(q.tensor_amax)));
    attrs.push_back(make_int_attribute("scale_type", onnx::TensorProto::FLOAT8E4M3FN));
    const auto [codes, s8] = out2("TRT_FP4DynamicQuantize", {fq.input, gs}, attrs);
    w.node("DequantizeLinear", {codes, w.node("DequantizeLinear", {s8, gs})}, block_attrs(q),
           fq.output);
    return true;
  }
  attrs.push_back(make_int_attribute("output_dtype", onnx::TensorProto::FLOAT8E4M3FN));
  const auto [codes, e8] = out2("TRT_MXFP8DynamicQuantize", {fq.input}, attrs);
  attrs = block_attrs(q);
  attrs.push_back(make_int_attribute("output_dtype", kFloat));
  w.node("TRT_MXFP8DequantizeLinear", {codes, e8}, attrs, fq.output);
  w.added->back().set_domain("trt");
  return true;
}

void activation(Writer& w, const FakeQuant& fq) {
  const QParams& q = fq.q;
  const std::string amax = block_amax(w, fq);
  std::string scale;
  if (q.format == QFormat::kNvfp4) {
    const std::string gs = w.f(mx::nvfp4_global_scale(static_cast<float>(q.tensor_amax)));
    std::string s = w.node("Div", {w.node("Div", {amax, w.f(mx::E2M1::kMax)}), gs});
    s = w.node("Clip", {s, w.f(std::ldexp(1.0, mx::E4M3::kEmin)), w.f(mx::E4M3::kMax)});
    const std::string s8 = w.node(
        "QuantizeLinear", {s, w.f(1.0)},
        {make_int_attribute("output_dtype", onnx::TensorProto::FLOAT8E4M3FN),
         make_int_attribute("saturate", 1)});
    scale = w.node("DequantizeLinear", {s8, gs});
  } else {
    const int emax = q.format == QFormat::kMxfp8 ? mx::E4M3::kEmax : mx::E2M1::kEmax;
    // amax = inf has exponent 128 (the op reads amax's exponent field): X = 2^(128 - emax)
    std::string e = w.node("Clip", {floor_log2(w, amax), w.f(-254.0), w.f(128.0)});
    e = w.node("Clip", {w.node("Sub", {e, w.f(emax)}), w.f(-127.0), w.f(128.0)});
    e = w.node("Where", {w.node("IsNaN", {amax}), amax, e});  // the E8M0 NaN: a NaN block
    scale = w.node("Pow", {w.f(2.0), e});
  }
  auto q_attrs = block_attrs(q);
  q_attrs.push_back(make_int_attribute("output_dtype", element_type(q.format)));
  if (q.format == QFormat::kMxfp8) q_attrs.push_back(make_int_attribute("saturate", 1));
  const std::string codes = w.node("QuantizeLinear", {fq.input, scale}, q_attrs);
  w.node("DequantizeLinear", {codes, scale}, block_attrs(q), fq.output);
}

}  // namespace

int64_t block_format_qdq(OnnxGraph& g, const FakeQuant& fq, bool tensorrt, bool qlinear_names,
                         std::vector<onnx::NodeProto>* added) {
  Writer w{g, added, fq.input, qlinear_names ? fq.name + "_quantized" : fq.name};
  if (const auto* init = g.initializer(fq.input)) {
    weight(w, fq, *init);
  } else if (tensorrt && tensorrt_activation(w, fq)) {
    if (g.opset("trt") < 1) g.set_opset("trt", 1);
  } else {
    activation(w, fq);
  }
  return fq.q.format == QFormat::kMxfp8 ? 21 : 23;
}

}  // namespace deploy
}  // namespace mqbench
