// Recognising fake-quantize groups in ONNX graphs (find_fake_quants) and the role of each
// (classify). The passes that remove or rewrite them are one file each in passes/ (pass.h).

#include "mqbench/deploy/fake_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

namespace mqbench {
namespace deploy {
namespace {

std::string describe(const onnx::NodeProto& n) { return "node '" + n.name() + "' (" + n.op_type() + ")"; }

bool is_custom_domain(const std::string& d) { return d.empty() || d == "mqbench"; }

const std::set<std::string>& custom_ops() {
  static const std::set<std::string> ops = {
      "FixedPerTensorAffine", "LearnablePerTensorAffine", "FixedPerChannelAffine",
      "FakeQuantizeLearnablePerchannelAffine", "FakeQuantizeDSQPertensor",
      "FakeQuantizeDSQPerchannel", "FakeQuantizeTqtAffine", "NNIEQuantize"};
  return ops;
}

}  // namespace

bool is_fake_quant_op(const std::string& op_type) { return custom_ops().count(op_type) > 0; }

namespace {

const std::map<std::string, QFormat>& block_format_ops() {
  static const std::map<std::string, QFormat> ops = {{"FakeQuantizeMXFP8", QFormat::kMxfp8},
                                                     {"FakeQuantizeMXFP4", QFormat::kMxfp4},
                                                     {"FakeQuantizeNVFP4", QFormat::kNvfp4}};
  return ops;
}

}  // namespace

bool is_block_format_op(const std::string& op_type) {
  return block_format_ops().count(op_type) > 0;
}

namespace {

int64_t scalar_int(const OnnxGraph& g, const onnx::NodeProto& n, int slot, const char* what) {
  const auto c = g.require_constant(n.input(slot), describe(n) + " " + what);
  if (c.numel() != 1) throw DeployError(describe(n) + ": " + what + " must be a scalar");
  return checked_int64(c.values[0], describe(n) + " " + what);
}

// quant_min / quant_max from inputs (MQBench 1.10's trailing Constant inputs) or attributes.
void read_range(const OnnxGraph& g, const onnx::NodeProto& n, int min_slot, FakeQuant* fq) {
  if (n.input_size() > min_slot + 1) {
    fq->q.quant_min = scalar_int(g, n, min_slot, "quant_min");
    fq->q.quant_max = scalar_int(g, n, min_slot + 1, "quant_max");
    return;
  }
  if (!find_attribute(n, "quant_min") || !find_attribute(n, "quant_max")) {
    throw DeployError(describe(n) + " carries no quant_min / quant_max (MQBench's main branch "
                      "exports DSQ and TQT nodes without them); re-export the model with mqbench");
  }
  fq->q.quant_min = int_attribute(n, "quant_min", 0);
  fq->q.quant_max = int_attribute(n, "quant_max", 0);
}

int64_t normalize_axis(const OnnxGraph& g, const onnx::NodeProto& n, int64_t axis, const std::string& x) {
  const auto* w = g.initializer(x);
  // Without an initializer the rank is unknown: any axis below 64 is taken (translators size
  // per-channel shapes by it), as no model has a tensor of higher rank.
  const int64_t rank = w ? w->dims_size() : 64;
  if (axis < 0 && !w) {
    throw DeployError(describe(n) + ": negative channel axis " + std::to_string(axis) +
                      " on a tensor of unknown rank");
  }
  if (axis < -rank || axis >= rank) {
    throw DeployError(describe(n) + ": channel axis " + std::to_string(axis) +
                      " is out of range for " + (w ? "weight '" + x + "' of rank " +
                      std::to_string(rank) : std::string("an activation")));
  }
  return axis < 0 ? axis + rank : axis;
}

// Fills scale and zero point, rounding and clamping the zero point into [qmin, qmax] (learnable
// quantizers keep it as a float).
void read_qparams(const OnnxGraph& g, const onnx::NodeProto& n, const std::string& scale,
                  const std::string& zero_point, FakeQuant* fq) {
  const auto s = g.require_constant(scale, describe(n) + " scale");
  fq->q.scale = s.values;
  if (fq->q.scale.empty()) throw DeployError(describe(n) + ": empty scale");
  std::vector<double> z(fq->q.scale.size(), 0.0);
  if (!zero_point.empty()) {
    const auto zc = g.require_constant(zero_point, describe(n) + " zero point");
    if (zc.numel() == 1) z.assign(fq->q.scale.size(), zc.values[0]);
    else if (zc.numel() == s.numel()) z = zc.values;
    else throw DeployError(describe(n) + ": " + std::to_string(zc.numel()) + " zero points for " +
                           std::to_string(s.numel()) + " scales");
  }
  if (fq->q.quant_min > fq->q.quant_max) {
    throw DeployError(describe(n) + ": quant_min " + std::to_string(fq->q.quant_min) +
                      " is above quant_max " + std::to_string(fq->q.quant_max));
  }
  // Integer grids of at most 32 bits: the passes compute quant_max - quant_min and bit widths.
  constexpr int64_t kRangeLimit = int64_t(1) << 32;
  if (fq->q.quant_min < -kRangeLimit || fq->q.quant_max > kRangeLimit) {
    throw DeployError(describe(n) + ": the range [" + std::to_string(fq->q.quant_min) + ", " +
                      std::to_string(fq->q.quant_max) + "] exceeds +-2^32");
  }
  fq->q.zero_point.clear();
  for (double v : z) {
    const int64_t r = checked_int64(v, describe(n) + " zero point");
    fq->q.zero_point.push_back(std::min(std::max(r, fq->q.quant_min), fq->q.quant_max));
  }
  for (double v : fq->q.scale) {
    if (!(v > 0) || !std::isfinite(v)) {
      throw DeployError(describe(n) + ": scale " + std::to_string(v) + " is not a positive finite "
                        "number (was the model calibrated?)");
    }
    // A DOUBLE scale may be finite and still beyond float, or make scale x range overflow: the
    // ranges written would be inf (null in JSON). Steps this large quantize nothing a float
    // model computes; 2^64 x a 2^33 range stays far inside float. Below float's smallest normal
    // number a scale written as float is 0 or loses its reciprocal, as the fake-quantize ops
    // refuse it too (docs/security.md).
    if (v > 0x1p64 || v < 0x1p-126) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", v);
      throw DeployError(describe(n) + ": scale " + text + (v > 1 ? " is above 2^64 (no float "
                        "model quantizes with such a step)" : " is below float32's smallest "
                        "normal number (1.18e-38)"));
    }
  }
}

void check_channels(const OnnxGraph& g, const onnx::NodeProto& n, FakeQuant* fq) {
  if (!fq->q.per_channel()) {
    if (fq->q.scale.size() != 1) {
      throw DeployError(describe(n) + ": a per-tensor node has " + std::to_string(fq->q.scale.size()) + " scales");
    }
    return;
  }
  if (const auto* w = g.initializer(fq->input)) {
    if (fq->q.axis < 0 || fq->q.axis >= w->dims_size() ||
        w->dims(static_cast<int>(fq->q.axis)) != static_cast<int64_t>(fq->q.scale.size())) {
      throw DeployError(describe(n) + ": " + std::to_string(fq->q.scale.size()) +
                        " per-channel scales do not match axis " + std::to_string(fq->q.axis) +
                        " of weight '" + fq->input + "'");
    }
  }
}

// NNIE's clip value; NaN, inf or a negative value would be written to the deploy files. Zero is
// a quantizer calibrated on all-zero data (a zero-initialised head): its range is {0}, and the
// NNIE translator says so in a note.
double checked_data_max(const onnx::NodeProto& n, double v) {
  if (!(v >= 0) || !std::isfinite(v)) {
    throw DeployError(describe(n) + ": data_max " + std::to_string(v) + " is not a finite number "
                      ">= 0 (was the model calibrated?)");
  }
  return v;
}

bool parse_custom(const OnnxGraph& g, int i, FakeQuant* fq) {
  const auto& n = g.graph().node(i);
  if (!is_custom_domain(n.domain()) || !custom_ops().count(n.op_type())) return false;
  const std::string& op = n.op_type();
  fq->op_type = op;
  fq->name = n.name();
  fq->nodes = {i};
  if (n.input_size() < 2 || n.output_size() < 1) throw DeployError(describe(n) + " has too few inputs");
  fq->input = n.input(0);
  fq->output = n.output(0);
  if (op == "NNIEQuantize") {
    fq->nnie = true;
    const auto d = g.require_constant(n.input(1), describe(n) + " data_max");
    if (d.values.empty()) throw DeployError(describe(n) + ": data_max is empty");
    fq->data_max = checked_data_max(n, d.values[0]);
    return true;
  }
  if (n.input_size() < 3) throw DeployError(describe(n) + " needs x, scale and zero_point inputs");
  if (op == "FixedPerChannelAffine") {
    if (n.input_size() < 6) throw DeployError(describe(n) + " needs x, scale, zero_point, ch_axis, quant_min, quant_max");
    fq->q.axis = normalize_axis(g, n, scalar_int(g, n, 3, "ch_axis"), fq->input);
    read_range(g, n, 4, fq);
  } else {
    read_range(g, n, 3, fq);
    if (op == "FakeQuantizeLearnablePerchannelAffine" || op == "FakeQuantizeDSQPerchannel") {
      fq->q.axis = normalize_axis(g, n, int_attribute(n, "ch_axis", 0), fq->input);
    }
  }
  read_qparams(g, n, n.input(1), n.input(2), fq);
  if (op == "FakeQuantizeTqtAffine") {
    // TQT quantizes with the power-of-two step at or above the scale (src/ops/cpu/tqt_kernel.cpp).
    for (auto& s : fq->q.scale) {
      const double e = s < std::ldexp(1.0, -15) ? 0.0 : std::floor(std::log2(1.0 / static_cast<float>(s)));
      s = std::exp2(-e);
    }
  }
  check_channels(g, n, fq);
  return true;
}

// FP8 Q/DQ: the float8 type of the zero point, or of output_dtype (opset 21) without one; 0 for
// an integer pair. FNUZ variants and 4-bit floats are refused by name (no backend reads them).
int32_t float8_type(const OnnxGraph& g, const onnx::NodeProto& q) {
  int32_t type = 0;
  ConstTensor zc;
  if (q.input_size() > 2 && !q.input(2).empty()) {
    const auto* init = g.initializer(q.input(2));
    if (init) type = init->data_type();
    else if (g.constant(q.input(2), &zc)) type = zc.elem_type;
  } else if (find_attribute(q, "output_dtype")) {
    type = static_cast<int32_t>(int_attribute(q, "output_dtype", 0));
  }
  switch (type) {
    case onnx::TensorProto::FLOAT8E4M3FN: case onnx::TensorProto::FLOAT8E5M2:
      return type;
    case onnx::TensorProto::FLOAT8E4M3FNUZ: case onnx::TensorProto::FLOAT8E5M2FNUZ:
    case onnx::TensorProto::FLOAT4E2M1: case onnx::TensorProto::FLOAT8E8M0:
      throw DeployError(describe(q) + " quantizes to ONNX type " + std::to_string(type) +
                        "; the deploy passes read FLOAT8E4M3FN, FLOAT8E5M2 and integer Q/DQ");
    default:
      return 0;
  }
}

// The FP8 group's parameters: zero points must be 0 (the formats have no offset), no Clip.
void read_float8(const OnnxGraph& g, const onnx::NodeProto& q, int32_t type, int clip,
                 FakeQuant* fq) {
  if (clip >= 0) {
    throw DeployError(describe(q) + ": a Clip between FP8 QuantizeLinear and DequantizeLinear");
  }
  fq->q.format = type == onnx::TensorProto::FLOAT8E5M2 ? QFormat::kFp8E5M2 : QFormat::kFp8E4M3;
  fq->q.saturate = int_attribute(q, "saturate", 1) != 0;
  fq->q.quant_min = fq->q.quant_max = 0;
  const std::string zp = q.input_size() > 2 ? q.input(2) : std::string();
  if (!zp.empty()) {
    for (double z : g.require_constant(zp, describe(q) + " zero point").values) {
      if (z != 0) throw DeployError(describe(q) + ": an FP8 zero point must be 0");
    }
  }
  const auto s = g.require_constant(q.input(1), describe(q) + " scale");
  if (s.numel() > 1 || (find_attribute(q, "axis") && s.dims.size() == 1)) {
    fq->q.axis = normalize_axis(g, q, int_attribute(q, "axis", 1), fq->input);
  }
  read_qparams(g, q, q.input(1), zp, fq);
  check_channels(g, q, fq);
}

// Blocked Q/DQ (opset 21): scale and zero point of x's rank, size(axis) / block_size at axis.
void read_blocked(const OnnxGraph& g, const onnx::NodeProto& q, const onnx::NodeProto& dq,
                  const std::string& zp, FakeQuant* fq) {
  const int64_t block = int_attribute(q, "block_size", 0);
  if (block < 0) throw DeployError(describe(q) + ": negative block_size " + std::to_string(block));
  if (int_attribute(dq, "block_size", 0) != block ||
      int_attribute(dq, "axis", 1) != int_attribute(q, "axis", 1)) {
    throw DeployError(describe(q) + " and " + describe(dq) + " disagree on block_size or axis");
  }
  const auto s = g.require_constant(q.input(1), describe(q) + " scale");
  const int64_t rank = static_cast<int64_t>(s.dims.size());
  int64_t axis = int_attribute(q, "axis", 1);
  if (axis < -rank || axis >= rank) {
    throw DeployError(describe(q) + ": axis " + std::to_string(axis) + " is out of range for a "
                      "block scale of rank " + std::to_string(rank));
  }
  fq->q.axis = axis < 0 ? axis + rank : axis;
  fq->q.block_size = block;
  fq->q.scale_dims = s.dims;
  read_qparams(g, q, q.input(1), zp, fq);
  if (const auto* w = g.initializer(fq->input)) {
    bool fits = w->dims_size() == rank;
    for (int64_t d = 0; fits && d < rank; ++d) {
      const int64_t size = w->dims(static_cast<int>(d));
      fits = s.dims[d] == (d == fq->q.axis ? size / block : size) &&
             (d != fq->q.axis || size % block == 0);
    }
    if (!fits) {
      throw DeployError(describe(q) + ": a block scale of " + std::to_string(s.numel()) +
                        " values does not tile weight '" + fq->input + "' in blocks of " +
                        std::to_string(block) + " along axis " + std::to_string(fq->q.axis));
    }
  }
}

// The block-scaled formats' nodes (python/mqbench/onnx/mx.py, DEPLOY_NODES): FakeQuantizeMXFP8
// / FakeQuantizeMXFP4 (x) and FakeQuantizeNVFP4 (x, global_amax), attributes block_size, axis and
// blocked_shape (x's shape with axis split into [blocks, block_size]; 0 copies x's dimension,
// -1 is inferred). Only in domain mqbench: MQBench never wrote them.
bool parse_block_format(const OnnxGraph& g, int i, FakeQuant* fq) {
  const auto& n = g.graph().node(i);
  const auto kind = block_format_ops().find(n.op_type());
  if (n.domain() != "mqbench" || kind == block_format_ops().end()) return false;
  QParams& q = fq->q;
  q.format = kind->second;
  const int inputs = q.format == QFormat::kNvfp4 ? 2 : 1;
  if (n.input_size() < inputs || n.output_size() < 1 || n.input(0).empty()) {
    throw DeployError(describe(n) + " needs " + (inputs == 2 ? "x and global_amax" : "x") +
                      " and an output");
  }
  fq->op_type = n.op_type();
  fq->name = n.name();
  fq->nodes = {i};
  fq->input = n.input(0);
  fq->output = n.output(0);
  q.quant_min = q.quant_max = 0;
  // A block of more than 2^16 elements is no format of docs/formats-mx.md (32 or 16).
  q.block_size = int_attribute(n, "block_size", 0);
  if (q.block_size < 1 || q.block_size > (1 << 16)) {
    throw DeployError(describe(n) + ": block_size " + std::to_string(q.block_size) +
                      " is not in [1, 65536]");
  }
  const auto* shape = find_attribute(n, "blocked_shape");
  if (!shape || shape->type() != onnx::AttributeProto::INTS) {
    throw DeployError(describe(n) + " has no blocked_shape (a list of ints)");
  }
  q.blocked_shape.assign(shape->ints().begin(), shape->ints().end());
  const auto rank = static_cast<int64_t>(q.blocked_shape.size()) - 1;
  q.axis = int_attribute(n, "axis", -1);
  if (rank < 1 || q.axis < 0 || q.axis >= rank || rank > 64 ||
      q.blocked_shape[static_cast<size_t>(q.axis + 1)] != q.block_size) {
    throw DeployError(describe(n) + ": axis " + std::to_string(q.axis) + " and blocked_shape "
                      "disagree (blocked_shape has x's rank + 1 entries, block_size at axis + 1)");
  }
  int inferred = 0;
  for (int64_t d : q.blocked_shape) {
    inferred += d == -1;
    if (d < -1 || inferred > 1) {
      throw DeployError(describe(n) + ": blocked_shape holds " + std::to_string(d) +
                        (d < -1 ? ", below -1" : ", a second -1"));
    }
  }
  if (const auto* w = g.initializer(fq->input)) {  // a weight: its shape must be the one split
    bool fits = w->dims_size() == rank;
    for (int64_t d = 0; fits && d < rank; ++d) {
      const int64_t size = w->dims(static_cast<int>(d));
      const int64_t want = q.blocked_shape[static_cast<size_t>(d <= q.axis ? d : d + 1)];
      fits = d == q.axis ? size % q.block_size == 0 &&
                               (want == -1 || want == size / q.block_size)
                         : want == 0 || want == -1 || want == size;
    }
    if (!fits) {
      throw DeployError(describe(n) + ": blocked_shape does not split weight '" + fq->input +
                        "' into blocks of " + std::to_string(q.block_size) + " along axis " +
                        std::to_string(q.axis));
    }
  }
  if (q.format == QFormat::kNvfp4) {
    const auto a = g.require_constant(n.input(1), describe(n) + " global_amax");
    // At most float's largest: a DOUBLE beyond it became an inf global scale in the files.
    if (a.numel() != 1 || !(a.values[0] >= 0) ||
        !(a.values[0] <= std::numeric_limits<float>::max())) {
      throw DeployError(describe(n) + ": global_amax must be one finite float32 number >= 0 (was "
                        "the model calibrated?)");
    }
    q.tensor_amax = a.values[0];
  }
  return true;
}

bool parse_qdq(const OnnxGraph& g, int i, FakeQuant* fq) {
  const auto& q = g.graph().node(i);
  if (q.op_type() != "QuantizeLinear" || !(q.domain().empty() || q.domain() == "ai.onnx")) return false;
  auto next = [&](const std::string& t) -> int {
    const auto c = g.consumers(t);
    return c.size() == 1 && !g.is_graph_output(t) ? c[0].first : -1;
  };
  int k = next(q.output(0));
  if (k < 0) return false;
  std::vector<int> nodes = {i};
  int clip = -1;
  if (g.graph().node(k).op_type() == "Clip") {
    clip = k;
    nodes.push_back(k);
    k = next(g.graph().node(k).output(0));
    if (k < 0) return false;
  }
  const auto& dq = g.graph().node(k);
  if (dq.op_type() != "DequantizeLinear") return false;  // a real quantized graph, not fake quant
  nodes.push_back(k);
  fq->op_type = q.op_type();
  fq->name = q.name();
  fq->nodes = nodes;
  fq->input = q.input(0);
  fq->output = dq.output(0);
  if (find_attribute(q, "data_max")) {  // MQBench main's NNIE form
    fq->nnie = true;
    fq->data_max = checked_data_max(q, float_attribute(q, "data_max", 0.f));
    return true;
  }
  if (q.input_size() < 2) throw DeployError(describe(q) + " has no scale input");
  ConstTensor scale;
  if (find_attribute(q, "block_size") && !g.constant(q.input(1), &scale)) {
    throw DeployError(describe(q) + " computes its block scales in the graph, as the MX / NVFP4 "
                      "activations of a deployed model do; the deploy passes read MX and NVFP4 "
                      "as convert_deploy exports them (docs/formats-mx.md), not deployed again");
  }
  if (const int32_t type = float8_type(g, q)) {
    read_float8(g, q, type, clip, fq);
    return true;
  }
  const std::string zp = q.input_size() > 2 ? q.input(2) : std::string();
  ConstTensor zc;
  const int32_t zp_type =
      !zp.empty() && g.constant(zp, &zc) ? zc.elem_type : onnx::TensorProto::UINT8;
  int64_t type_min = 0, type_max = 255;
  switch (zp_type) {
    case onnx::TensorProto::INT8: type_min = -128; type_max = 127; break;
    case onnx::TensorProto::INT4: type_min = -8; type_max = 7; break;
    case onnx::TensorProto::UINT4: type_max = 15; break;
    default: break;
  }
  if (find_attribute(q, "quant_min") && find_attribute(q, "quant_max")) {
    fq->q.quant_min = int_attribute(q, "quant_min", 0);
    fq->q.quant_max = int_attribute(q, "quant_max", 0);
  } else if (clip >= 0) {
    const auto& c = g.graph().node(clip);
    const bool has_min = c.input_size() > 1 && !c.input(1).empty();
    const bool has_max = c.input_size() > 2 && !c.input(2).empty();
    fq->q.quant_min = has_min ? scalar_int(g, c, 1, "min") : type_min;
    fq->q.quant_max = has_max ? scalar_int(g, c, 2, "max") : type_max;
  } else {
    fq->q.quant_min = type_min;
    fq->q.quant_max = type_max;
  }
  if (find_attribute(q, "block_size") && int_attribute(q, "block_size", 0) != 0) {
    read_blocked(g, q, dq, zp, fq);
    return true;
  }
  const auto s = g.require_constant(q.input(1), describe(q) + " scale");
  if (s.numel() > 1 || (find_attribute(q, "axis") && s.dims.size() == 1)) {
    fq->q.axis = normalize_axis(g, q, int_attribute(q, "axis", 1), fq->input);
  }
  read_qparams(g, q, q.input(1), zp, fq);
  check_channels(g, q, fq);
  return true;
}

}  // namespace

int QParams::bit() const {
  if (format == QFormat::kMxfp4 || format == QFormat::kNvfp4) return 4;
  if (format != QFormat::kInt) return 8;
  return static_cast<int>(std::lround(std::log2(static_cast<double>(quant_max - quant_min + 1))));
}
double QParams::min_value(size_t c) const { return scale.at(c) * static_cast<double>(quant_min - zero_point.at(c)); }
double QParams::max_value(size_t c) const { return scale.at(c) * static_cast<double>(quant_max - zero_point.at(c)); }

std::string QParams::describe() const {
  std::string what;
  switch (format) {
    case QFormat::kFp8E4M3: what = "FP8 E4M3"; break;
    case QFormat::kFp8E5M2: what = "FP8 E5M2"; break;
    case QFormat::kMxfp8: what = "MXFP8 (E4M3 elements, a power-of-two scale per block)"; break;
    case QFormat::kMxfp4: what = "MXFP4 (E2M1 elements, a power-of-two scale per block)"; break;
    case QFormat::kNvfp4: what = "NVFP4 (E2M1 elements, an E4M3 scale per block)"; break;
    default:
      what = std::string(blocked() ? "group-wise " : "") + "integer [" + std::to_string(quant_min) +
             ", " + std::to_string(quant_max) + "]";
  }
  if (blocked()) {
    return what + ", blocks of " + std::to_string(block_size) + " on axis " + std::to_string(axis);
  }
  return what +
         (per_channel() ? " per channel (axis " + std::to_string(axis) + ")" : " per tensor");
}

void refuse_format(const FakeQuant& fq, const std::string& backend) {
  if (!fq.q.is_format()) return;
  std::string where;
  if (fq.q.data_scaled()) {
    where = "MX and NVFP4 deploy to Tensorrt (its QDQ model, onnx_quantized_model.onnx), QDQ "
            "and Academic (weights as FP8 / FP4 initializers, activations with their block "
            "scales computed in the graph; opset 21 / 23); docs/formats-mx.md";
  } else if (fq.q.format != QFormat::kInt) {
    where = "FP8 deploys to Tensorrt (its QDQ model, onnx_quantized_model.onnx), QDQ and "
            "Academic (QuantizeLinear with a float8 zero point, opset 19); docs/formats.md";
  } else {
    where = "Group-wise quantization deploys to QDQ and Academic (blocked QuantizeLinear, opset "
            "21) and, as INT4 weights, to Tensorrt; docs/formats.md";
  }
  throw DeployError("fake quantizer '" + fq.name + "' is " + fq.q.describe() + "; " +
                    (backend.empty() ? std::string("this backend") : backend) +
                    " deploys integer quantization with one scale per tensor or channel. " +
                    where);
}

const char* role_name(Role r) {
  switch (r) {
    case Role::kWeight: return "weight";
    case Role::kBias: return "bias";
    default: return "activation";
  }
}

std::vector<FakeQuant> find_fake_quants(const OnnxGraph& g) {
  std::vector<FakeQuant> out;
  std::set<int> taken;
  for (int i = 0; i < g.graph().node_size(); ++i) {
    if (taken.count(i)) continue;
    FakeQuant fq;
    if (parse_custom(g, i, &fq) || parse_block_format(g, i, &fq) || parse_qdq(g, i, &fq)) {
      taken.insert(fq.nodes.begin(), fq.nodes.end());
      out.push_back(std::move(fq));
    }
  }
  return out;
}

namespace {

// A Linear layer applied to a 3-d or larger input exports as Transpose(weight) -> MatMul: the
// MatMul node when `node` is such a Transpose whose every consumer is a MatMul, else -1.
int matmul_through_transpose(const OnnxGraph& g, int node) {
  const auto& n = g.graph().node(node);
  if (n.op_type() != "Transpose" || n.output_size() != 1) return -1;
  const auto cs = g.consumers(n.output(0));
  if (cs.empty() || g.is_graph_output(n.output(0))) return -1;
  for (const auto& c : cs) {
    if (g.graph().node(c.first).op_type() != "MatMul") return -1;
  }
  return cs[0].first;
}

}  // namespace

Role classify(const OnnxGraph& g, const FakeQuant& fq, std::string* consumer, std::string* consumer_op) {
  static const std::set<std::string> weight_ops = {"Conv", "Gemm", "ConvTranspose", "MatMul"};
  const auto cs = g.consumers(fq.output);
  auto fill = [&](int node) {
    if (consumer) *consumer = g.graph().node(node).name();
    if (consumer_op) *consumer_op = g.graph().node(node).op_type();
  };
  // The weight of a Linear on a 3-d input: an initializer through the quantizer and a Transpose.
  if (cs.size() == 1 && !g.is_graph_output(fq.output) && g.initializer(fq.input) != nullptr) {
    const int matmul = matmul_through_transpose(g, cs[0].first);
    if (matmul >= 0) {
      fill(matmul);
      return Role::kWeight;
    }
  }
  // MX / NVFP4 have an axis but no per-channel scales: activations are what they quantize most.
  if (fq.q.per_channel() && !fq.q.data_scaled()) {
    for (const auto& c : cs) {
      const auto& n = g.graph().node(c.first);
      // an embedding table: Gather's data input (an nn.Embedding's weight fake quantizer)
      const bool table = n.op_type() == "Gather" && c.second == 0;
      if (!weight_ops.count(n.op_type()) && !table) {
        throw DeployError("per-channel fake quantizer '" + fq.name + "' feeds " + describe(n) +
                          "; per-channel quantization is only deployable on the weights of Conv, "
                          "ConvTranspose, Gemm and MatMul (directly or through a Transpose) and "
                          "on embedding tables (Gather's data)");
      }
    }
    if (!cs.empty()) fill(cs[0].first);
    return Role::kWeight;
  }
  if (cs.size() == 1 && !g.is_graph_output(fq.output)) {
    const auto& n = g.graph().node(cs[0].first);
    if (n.op_type() == "Conv" || n.op_type() == "Gemm" || n.op_type() == "ConvTranspose") {
      if (cs[0].second == 1) { fill(cs[0].first); return Role::kWeight; }
      if (cs[0].second == 2) { fill(cs[0].first); return Role::kBias; }
    }
  }
  return Role::kActivation;
}

}  // namespace deploy
}  // namespace mqbench
