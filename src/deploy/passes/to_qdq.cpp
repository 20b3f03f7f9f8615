// to_qdq: every fake-quantize group becomes a standard QuantizeLinear [-> Clip] ->
// DequantizeLinear pair with constant scales and INT8 / UINT8 zero points (opset 13).

#include "mqbench/deploy/fake_quant.h"

#include <algorithm>

#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {

bool to_qdq(OnnxGraph& g, const QdqOptions& options) {
  const PassScope scope("to_qdq", g);
  const auto fqs = find_fake_quants(g);
  std::set<int> dead;
  std::vector<onnx::NodeProto> added;
  for (const auto& fq : fqs) {
    if (fq.nnie) {
      throw DeployError("fake quantizer '" + fq.name + "' is NNIE's logarithmic quantizer, which "
                        "has no QuantizeLinear form");
    }
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
    int32_t type;
    int64_t lo, hi;
    if (q.quant_min >= 0 && q.quant_max <= 255) {
      type = onnx::TensorProto::UINT8; lo = 0; hi = 255;
    } else if (q.quant_min >= -128 && q.quant_max <= 127) {
      type = onnx::TensorProto::INT8; lo = -128; hi = 127;
    } else {
      throw DeployError("fake quantizer '" + fq.name + "': the range [" + std::to_string(q.quant_min) +
                        ", " + std::to_string(q.quant_max) + "] fits neither int8 nor uint8, so "
                        "it has no QuantizeLinear / DequantizeLinear form");
    }
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
    const std::vector<int64_t> dims = q.per_channel() ? std::vector<int64_t>{static_cast<int64_t>(q.scale.size())}
                                                      : std::vector<int64_t>{};
    const std::string base = fq.input;
    const std::string s_name = g.unique_name(base + "_scale");
    const std::string z_name = g.unique_name(base + "_zero_point");
    g.set_initializer(make_tensor(s_name, onnx::TensorProto::FLOAT, dims, q.scale));
    g.set_initializer(make_tensor(z_name, type, dims, {q.zero_point.begin(), q.zero_point.end()}));
    const std::string q_out = g.unique_name(base + "_quantized");
    onnx::NodeProto qn, dqn;
    qn.set_op_type("QuantizeLinear");
    qn.set_name(g.unique_name(options.qlinear_names ? fq.name + "_quantized" : fq.name));
    qn.add_input(fq.input);
    qn.add_input(s_name);
    qn.add_input(z_name);
    qn.add_output(q_out);
    std::string dq_in = q_out;
    if (q.per_channel()) {
      auto* a = qn.add_attribute();
      a->set_name("axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(q.axis);
    }
    added.push_back(qn);
    // A narrower range saturates exactly through an integer Clip; TensorRT's QDQ has none (it
    // takes [-127, 127] as int8, as MQBench's ONNXQLinearPass writes it). There a weight is
    // clipped to the narrow range instead, so a weight that training clipped to -127 s is not
    // quantized to -128 s; an activation below -127.5 s still reaches -128 s (TensorRT's
    // int8), one level past what training computed (docs/compatibility.md row 137).
    const bool narrow = q.quant_min != lo || q.quant_max != hi;
    if (narrow && options.tensorrt) clip_weight(g, fq.input, fq.q);
    if (narrow && !options.tensorrt) {
      const std::string mn = g.unique_name(base + "_qmin"), mx = g.unique_name(base + "_qmax");
      g.set_initializer(make_tensor(mn, type, {}, {static_cast<double>(q.quant_min)}));
      g.set_initializer(make_tensor(mx, type, {}, {static_cast<double>(q.quant_max)}));
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
    if (q.per_channel()) *dqn.add_attribute() = qn.attribute(0);
    added.push_back(dqn);
    dead.insert(fq.nodes.begin(), fq.nodes.end());
  }
  g.replace_nodes(dead, std::move(added));  // old groups out, new nodes in, sorted
  if (g.opset("") < 13) g.set_opset("", 13);
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
