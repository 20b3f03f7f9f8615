// Tensorrt: the float model without fake quantization (<name>_deploy_model.onnx) and each
// activation's symmetric clip value (<name>_clip_ranges.json, {"tensorrt": {"blob_range":
// {tensor: s * max(-qmin, qmax)}}}), as MQBench's deploy_qparams_tensorrt. With
// deploy_to_qlinear, also the QDQ model onnx_quantized_model.onnx (translator
// "tensorrt_qlinear", MQBench's ONNXQLinearPass): 8-bit symmetric only. A model with FP8 fake
// quantizers (docs/formats.md) gets the QDQ model alone, FP8 Q/DQ included (opset 19); one with
// group-wise weights the same, each weight an INT4 initializer read by a DequantizeLinear.
// Beside the clip ranges, <name>_calib.cache: the same ranges as a TensorRT calibration cache,
// which `trtexec --int8 --calib=<name>_calib.cache` reads (calibration_cache below). A layer
// whose weight is quantized but whose input is not is refused (find_float_layers).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

// The first line of a TensorRT calibration cache is "TRT-<version>-<algorithm>": the version is
// NV_TENSORRT_VERSION of the TensorRT that wrote it (major * 1000 + minor * 100 + patch up to
// 8.x: 8601 is 8.6.1; major * 10000 + minor * 100 + patch from 10.0: 100300 is 10.3.0), the
// algorithm the calibrator's (trtexec's --calib calibrator is IInt8EntropyCalibrator2). TensorRT
// reads a cache whose header names its own version and algorithm, and may set aside one written
// by another release (a TensorRT 10 build has been seen refusing an 8.6 header). 8.6.1 is the last
// TensorRT 8 release and the one whose trtexec --calib most users of implicit INT8 run (TensorRT
// 10 deprecates implicit quantization); for another release, edit the number in the first line
// (docs/deploy.md). The lines below it do not depend on the version.
constexpr char kCalibrationCacheHeader[] = "TRT-8601-EntropyCalibration2";

// TensorRT derives an INT8 tensor's scale from its dynamic range as range / 127; a calibration
// cache holds that scale as the big-endian bit pattern of the float32, in 8 lower-case hex digits.
std::string float_bits_hex(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(bits));
  return hex;
}

// <name>_calib.cache: one "<tensor>: <scale>" line per entry of blob_range, in its order, scale =
// float32(range / 127). For the Tensorrt scheme (symmetric, [-127, 127]) a range is s * 127 in
// double, exact for a float32 s, so the line holds the activation quantizer's scale s itself,
// bit for bit the scale of that tensor's QuantizeLinear in onnx_quantized_model.onnx. A name
// runs to the line's last ": "; a name holding a control character is refused (a '\n' would
// forge a line).
Artifact calibration_cache(const std::string& model_name, const Json& blob_range) {
  std::string text = std::string(kCalibrationCacheHeader) + "\n";
  for (const auto& item : blob_range.items()) {
    check_text_key(item.key(), "Tensorrt", "the calibration cache, one \"<tensor>: <scale>\" line "
                   "per tensor", true);
    const Json& v = item.value();
    const double range = v.is_number() ? v.get<double>() : 0.0;
    if (!v.is_number() || !std::isfinite(range) || !(range > 0)) {
      throw DeployError("Tensorrt: the range of tensor '" + item.key() + "' is " + v.dump() +
                        "; the calibration cache needs a positive number");
    }
    text += item.key() + ": " + float_bits_hex(static_cast<float>(range / 127.0)) + "\n";
  }
  return {model_name + "_calib.cache", std::move(text)};
}

Artifact qlinear(OnnxGraph g) {
  QdqOptions o;
  o.tensorrt = true;
  o.qlinear_names = true;
  o.backend = "Tensorrt";
  to_qdq(g, o);
  return onnx_file("onnx_quantized_model.onnx", g);
}

DeployOutput tensorrt(OnnxGraph g, const DeployOptions& options) {
  // Found on the fake-quantized model, answered once the files are made (so a model's other
  // errors come first).
  const auto float_layers = find_float_layers(g);
  // TensorRT reads FP8 only as explicit Q/DQ: no clip value in blob_range can say "FP8".
  const auto fqs = find_fake_quants(g);
  const auto format = std::find_if(fqs.begin(), fqs.end(),
                                   [](const FakeQuant& fq) { return fq.q.is_format(); });
  if (format != fqs.end()) {
    DeployOutput out{{qlinear(std::move(g))},
                     {"fake quantizer '" + format->name + "' is " + format->q.describe() +
                      ", which TensorRT reads only from a QDQ model: wrote "
                      "onnx_quantized_model.onnx alone (no " + options.model_name +
                      "_deploy_model.onnx, clip ranges or calibration cache)"}};
    answer_float_layers(float_layers, options, "Tensorrt", &out.notes);
    return out;
  }
  DeployOutput out;
  if (options.deploy_to_qlinear) out.files.push_back(qlinear(g));  // from a copy of the fakeq model
  JsonObject ranges;
  for (const auto& r : remove_for(g, "Tensorrt")) {
    if (r.role != Role::kActivation) continue;
    const auto& q = r.fq.q;
    ranges[r.tensor] = q.scale[0] * static_cast<double>(std::max(-q.quant_min, q.quant_max));
  }
  propagate_ranges(g, ranges, options);
  const Json blob_range = ranges.json();  // the final table, a user's post_process_clip_ranges' too
  const Json j{{"tensorrt", Json{{"blob_range", blob_range}}}};
  auto files = ranges_and_model(options, j, g).files;
  files.push_back(calibration_cache(options.model_name, blob_range));
  out.files.insert(out.files.begin(), files.begin(), files.end());
  answer_float_layers(float_layers, options, "Tensorrt", &out.notes);
  return out;
}

DeployOutput tensorrt_qlinear(OnnxGraph fakeq, const DeployOptions&) {
  return DeployOutput{{qlinear(std::move(fakeq))}, {}};
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tensorrt, "tensorrt", mqbench::deploy::translators::tensorrt);
MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tensorrt_qlinear, "tensorrt_qlinear",
                                   mqbench::deploy::translators::tensorrt_qlinear);
