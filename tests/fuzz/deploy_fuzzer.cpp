// libFuzzer target over the deploy entry point: ONNX bytes + backend -> artifacts or an error.
//
// The contract under test (docs/security.md): for any input, every backend's translator either
// returns artifacts or raises mqbench::Error. Anything else is a finding: a crash, a sanitizer
// report, another exception type escaping, or artifacts that break the output invariants (a file
// name that is not one plain name, an ONNX file that does not parse, is structurally broken or
// fails onnx's full checker -- onnx::checker::check_model and strict shape inference, as
// onnx.checker.check_model(full_check=True) -- JSON that does not parse or holds a null where a
// number was meant). onnxruntime's loader is the other half of "a runtime accepts it": that check
// runs in Python, in tests/fuzz/campaign.py.
//
// The mutator is structure-aware: most mutations parse the input as a ModelProto and change it
// the way a careless exporter or a hostile file would (attributes set to extremes, inputs rewired
// to other tensors or to nothing, nodes deleted, duplicated or retyped, initializers with NaN,
// wrong dims or truncated data), then serialize it again; the rest are libFuzzer's byte
// mutations. Environment: MQBENCH_FUZZ_BACKEND=<name> limits the run to one backend; without it
// each input goes through one backend of every translator.
// Build and run: tests/fuzz/README.md.

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mqbench/backend.h"
#include "mqbench/deploy/translator.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using mqbench::deploy::DeployOptions;
using mqbench::deploy::OnnxGraph;

std::vector<std::string>& backends() {
  static std::vector<std::string> names;
  return names;
}

[[noreturn]] void finding(const std::string& backend, const std::string& what) {
  std::fprintf(stderr, "deploy_fuzzer: backend %s: %s\n", backend.c_str(), what.c_str());
  std::abort();
}

bool has_null(const nlohmann::json& j) {
  // Iterative: the depth of a JSON document is the translator's, but a finding must not recurse.
  std::vector<const nlohmann::json*> stack{&j};
  while (!stack.empty()) {
    const nlohmann::json* v = stack.back();
    stack.pop_back();
    if (v->is_null()) return true;
    if (v->is_structured()) {
      for (const auto& child : *v) stack.push_back(&child);
    }
  }
  return false;
}

// onnx's full checker on a written model, as it is (onnx's C++ checker, compiled into the deploy
// library, not the library's own check_model). The one allowance: NNIE's deploy model keeps
// Upsample (deprecated since opset 10), which NNIE's toolchain reads; it is moved to a private
// domain for the check.
void full_check(const std::string& backend, const std::string& name, onnx::ModelProto m) {
  if (mqbench::deploy::translator_of_backend(backend) == "nnie") {
    bool moved = false;
    for (auto& n : *m.mutable_graph()->mutable_node()) {
      if (n.domain().empty() && n.op_type() == "Upsample") {
        n.set_domain("nnie.upsample");
        moved = true;
      }
    }
    if (moved) {
      auto* op = m.add_opset_import();
      op->set_domain("nnie.upsample");
      op->set_version(1);
    }
  }
  // (Every opset and IR version the deploy writes is one the compiled-in onnx 1.23 knows: a file
  // it could not judge is a finding too, reported by its checker.)
  try {
    onnx::checker::check_model(m);
    onnx::ShapeInferenceOptions strict(/*check_type=*/true, /*error_mode=*/1, false);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), strict);
  } catch (const std::exception& e) {
    finding(backend, name + " fails onnx's full checker: " + e.what());
  }
}

void check_artifacts(const std::string& backend, const mqbench::deploy::DeployOutput& out) {
  for (const auto& f : out.files) {
    try {
      mqbench::deploy::check_file_name(f.file_name, "artifact name");
    } catch (const mqbench::Error& e) {
      finding(backend, e.what());
    }
    const auto ends_with = [&](const char* suffix) {
      const size_t n = std::strlen(suffix);
      return f.file_name.size() >= n && f.file_name.compare(f.file_name.size() - n, n, suffix) == 0;
    };
    if (ends_with(".onnx")) {
      // Structure, not parse()'s input rules: a graph whose output is its input has no node.
      onnx::ModelProto m;
      if (!m.ParseFromString(f.contents)) finding(backend, f.file_name + " does not parse");
      try {
        OnnxGraph(m).check_structure(f.file_name);
      } catch (const mqbench::Error& e) {
        finding(backend, std::string("wrote a broken ONNX file: ") + e.what());
      }
      full_check(backend, f.file_name, std::move(m));
    } else if (ends_with(".json") && mqbench::deploy::translator_of_backend(backend) == "pplcuda") {
      // MQBench's PPL CUDA file is "<tensor>: <clip>" lines, not JSON.
      std::istringstream lines(f.contents);
      for (std::string line; std::getline(lines, line);) {
        const size_t colon = line.rfind(": ");
        char* end = nullptr;
        const double v = colon == std::string::npos ? NAN : std::strtod(&line[colon + 2], &end);
        if (!std::isfinite(v) || *end != '\0') finding(backend, "bad clip range line: " + line);
      }
    } else if (ends_with(".scale")) {
      // Tengine's "<tensor> <scale> <zero_point>" lines: three fields, a finite scale, an integer.
      std::istringstream lines(f.contents);
      for (std::string line; std::getline(lines, line);) {
        std::istringstream fields(line);
        std::string name, scale, zero, extra;
        fields >> name >> scale >> zero;
        char* end = nullptr;
        const double s = scale.empty() ? NAN : std::strtod(scale.c_str(), &end);
        const bool scale_ok = std::isfinite(s) && *end == '\0';
        const bool zero_ok = !zero.empty() && zero.find_first_not_of("-0123456789") == std::string::npos;
        if (name.empty() || !scale_ok || !zero_ok || (fields >> extra)) {
          finding(backend, "bad scale line: " + line);
        }
      }
    } else if (ends_with(".cache")) {
      // Tensorrt's calibration cache: its header, then "<tensor>: <8 hex digits>" lines.
      std::istringstream lines(f.contents);
      std::string line;
      if (!std::getline(lines, line) || line.rfind("TRT-", 0) != 0) {
        finding(backend, "calibration cache without its header: " + line);
      }
      while (std::getline(lines, line)) {
        const size_t colon = line.rfind(": ");
        const std::string hex = colon == std::string::npos ? "" : line.substr(colon + 2);
        if (colon == 0 || hex.size() != 8 ||
            hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
          finding(backend, "bad calibration cache line: " + line);
        }
      }
    } else if (ends_with(".json")) {
      const auto j = nlohmann::json::parse(f.contents, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) finding(backend, f.file_name + " is not valid JSON");
      if (has_null(j)) finding(backend, f.file_name + " holds a null (a NaN written as JSON?)");
    }
  }
}

// ---- the structure-aware mutator ------------------------------------------------------------

using Rng = std::minstd_rand;

size_t pick(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

int64_t extreme_int(Rng& rng) {
  static const int64_t values[] = {0, 1, -1, 2, -2, 3, 4, 8, 64, 100, -100, 255, 256, 1 << 24,
                                   std::numeric_limits<int32_t>::max(),
                                   std::numeric_limits<int64_t>::max(),
                                   std::numeric_limits<int64_t>::min()};
  return values[pick(rng, std::size(values))];
}

float extreme_float(Rng& rng) {
  static const float values[] = {0.f, -0.f, 1.f, -1.f, 0.5f, 1e-40f, 1e-7f, 3e38f, 255.f,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity()};
  return values[pick(rng, std::size(values))];
}

const char* op_type(Rng& rng) {
  static const char* types[] = {
      "FixedPerTensorAffine", "FixedPerChannelAffine", "LearnablePerTensorAffine",
      "FakeQuantizeLearnablePerchannelAffine", "FakeQuantizeDSQPertensor",
      "FakeQuantizeDSQPerchannel", "FakeQuantizeTqtAffine", "NNIEQuantize", "FakeQuantizeMXFP8",
      "FakeQuantizeMXFP4", "FakeQuantizeNVFP4", "QuantizeLinear",
      "DequantizeLinear", "Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Clip",
      "Round", "Constant", "Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Concat", "Relu",
      "Sigmoid", "Resize", "Upsample", "Pad", "MaxPool", "GlobalAveragePool", "Transpose"};
  return types[pick(rng, std::size(types))];
}

// Every tensor name the graph knows, to rewire inputs to (cycles and forward references
// included) and a few it does not.
std::vector<std::string> tensor_names(const onnx::GraphProto& g) {
  std::vector<std::string> names{"", "fuzz_dangling"};
  for (const auto& v : g.input()) names.push_back(v.name());
  for (const auto& t : g.initializer()) names.push_back(t.name());
  for (const auto& n : g.node()) {
    for (const auto& o : n.output()) names.push_back(o);
  }
  return names;
}

void mutate_attribute(onnx::AttributeProto& a, Rng& rng) {
  switch (a.type()) {
    case onnx::AttributeProto::INT:
      a.set_i(extreme_int(rng));
      break;
    case onnx::AttributeProto::FLOAT:
      a.set_f(extreme_float(rng));
      break;
    case onnx::AttributeProto::INTS:
      if (a.ints_size() == 0 || pick(rng, 4) == 0) {
        a.add_ints(extreme_int(rng));
      } else if (pick(rng, 3) == 0) {
        a.mutable_ints()->RemoveLast();
      } else {
        a.set_ints(static_cast<int>(pick(rng, a.ints_size())), extreme_int(rng));
      }
      break;
    case onnx::AttributeProto::FLOATS:
      if (a.floats_size() == 0) a.add_floats(extreme_float(rng));
      else a.set_floats(static_cast<int>(pick(rng, a.floats_size())), extreme_float(rng));
      break;
    case onnx::AttributeProto::STRING:
      a.set_s(pick(rng, 2) ? "" : "nearest");
      break;
    default:
      a.set_type(onnx::AttributeProto::INT);  // a type the reader does not expect
      a.set_i(extreme_int(rng));
  }
}

void mutate_tensor(onnx::TensorProto& t, Rng& rng) {
  switch (pick(rng, 6)) {
    case 0: {  // one value to an extreme (float tensors in raw or typed form)
      if (t.data_type() == onnx::TensorProto::FLOAT && t.raw_data().size() >= 4) {
        std::string raw = t.raw_data();
        const float v = extreme_float(rng);
        std::memcpy(&raw[4 * pick(rng, raw.size() / 4)], &v, 4);
        t.set_raw_data(raw);
      } else if (t.float_data_size() > 0) {
        t.set_float_data(static_cast<int>(pick(rng, t.float_data_size())), extreme_float(rng));
      } else if (t.int64_data_size() > 0) {
        t.set_int64_data(static_cast<int>(pick(rng, t.int64_data_size())), extreme_int(rng));
      } else if (t.raw_data().size() >= 8) {
        std::string raw = t.raw_data();
        const int64_t v = extreme_int(rng);
        std::memcpy(&raw[8 * pick(rng, raw.size() / 8)], &v, 8);
        t.set_raw_data(raw);
      }
      break;
    }
    case 1:  // dims that disagree with the data
      if (t.dims_size() > 0 && pick(rng, 2)) {
        t.set_dims(static_cast<int>(pick(rng, t.dims_size())), extreme_int(rng));
      } else {
        t.add_dims(extreme_int(rng));
      }
      break;
    case 2:
      if (t.dims_size() > 0) t.mutable_dims()->RemoveLast();
      break;
    case 3:  // truncated data
      if (!t.raw_data().empty()) t.set_raw_data(t.raw_data().substr(0, pick(rng, t.raw_data().size())));
      break;
    case 4: {
      static const int32_t types[] = {onnx::TensorProto::UNDEFINED, onnx::TensorProto::FLOAT,
                                      onnx::TensorProto::DOUBLE,    onnx::TensorProto::INT8,
                                      onnx::TensorProto::UINT8,     onnx::TensorProto::INT32,
                                      onnx::TensorProto::INT64,     onnx::TensorProto::FLOAT16,
                                      onnx::TensorProto::STRING,    12345};
      t.set_data_type(types[pick(rng, std::size(types))]);
      break;
    }
    default:
      t.set_data_location(onnx::TensorProto::EXTERNAL);
  }
}

void mutate_model(onnx::ModelProto& m, Rng& rng) {
  onnx::GraphProto& g = *m.mutable_graph();
  const int nodes = g.node_size();
  switch (pick(rng, 11)) {
    case 0:
    case 1: {  // an attribute to an extreme value
      if (nodes == 0) break;
      auto& n = *g.mutable_node(static_cast<int>(pick(rng, nodes)));
      if (n.attribute_size() == 0 || pick(rng, 5) == 0) {
        static const char* names[] = {"axis", "axes", "perm", "ch_axis", "quant_min",
                                      "quant_max", "mode", "to", "group", "pads",
                                      "block_size", "blocked_shape"};
        auto* a = n.add_attribute();
        a->set_name(names[pick(rng, std::size(names))]);
        a->set_type(pick(rng, 2) ? onnx::AttributeProto::INT : onnx::AttributeProto::INTS);
        mutate_attribute(*a, rng);
      } else {
        mutate_attribute(*n.mutable_attribute(static_cast<int>(pick(rng, n.attribute_size()))), rng);
      }
      break;
    }
    case 2:
    case 3: {  // an input rewired: cycles, dangling names, missing inputs
      if (nodes == 0) break;
      auto& n = *g.mutable_node(static_cast<int>(pick(rng, nodes)));
      const auto names = tensor_names(g);
      if (n.input_size() == 0 || pick(rng, 6) == 0) n.add_input(names[pick(rng, names.size())]);
      else if (pick(rng, 6) == 0) n.mutable_input()->RemoveLast();
      else n.set_input(static_cast<int>(pick(rng, n.input_size())), names[pick(rng, names.size())]);
      break;
    }
    case 4:  // a node deleted
      if (nodes > 0) {
        g.mutable_node()->SwapElements(static_cast<int>(pick(rng, nodes)), nodes - 1);
        g.mutable_node()->RemoveLast();
      }
      break;
    case 5:  // a node duplicated (its outputs produced twice) or moved
      if (nodes > 0) {
        const int i = static_cast<int>(pick(rng, nodes));
        if (pick(rng, 2)) *g.add_node() = g.node(i);
        else g.mutable_node()->SwapElements(i, static_cast<int>(pick(rng, nodes)));
      }
      break;
    case 6:  // a node retyped (another fake-quantize type, a shape op, ...) or its domain changed
      if (nodes > 0) {
        auto& n = *g.mutable_node(static_cast<int>(pick(rng, nodes)));
        if (pick(rng, 4) == 0) n.set_domain(n.domain().empty() ? "mqbench" : "");
        else n.set_op_type(op_type(rng));
      }
      break;
    case 7:
    case 8:  // an initializer's values, dims or type
      if (g.initializer_size() > 0) {
        mutate_tensor(*g.mutable_initializer(static_cast<int>(pick(rng, g.initializer_size()))), rng);
      }
      break;
    case 9:  // an initializer removed
      if (g.initializer_size() > 0) {
        g.mutable_initializer()->SwapElements(static_cast<int>(pick(rng, g.initializer_size())),
                                              g.initializer_size() - 1);
        g.mutable_initializer()->RemoveLast();
      }
      break;
    default: {  // graph outputs: one renamed or added
      const auto names = tensor_names(g);
      if (g.output_size() > 0 && pick(rng, 2)) {
        g.mutable_output(static_cast<int>(pick(rng, g.output_size())))
            ->set_name(names[pick(rng, names.size())]);
      } else {
        g.add_output()->set_name(names[pick(rng, names.size())]);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // One backend per translator (Tensorrt_NLP and Academic_NLP deploy as Academic), or the one
  // MQBENCH_FUZZ_BACKEND names.
  const char* only = std::getenv("MQBENCH_FUZZ_BACKEND");
  std::vector<std::string> translators;
  for (const auto& name : mqbench::backend_names()) {
    const auto translator = mqbench::deploy::translator_of_backend(name);
    if (only != nullptr && *only != '\0' ? name == only
                                          : std::find(translators.begin(), translators.end(),
                                                      translator) == translators.end()) {
      backends().push_back(name);
      translators.push_back(translator);
    }
  }
  if (backends().empty()) {
    std::fprintf(stderr, "deploy_fuzzer: MQBENCH_FUZZ_BACKEND=%s names no backend\n", only);
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  OnnxGraph graph(onnx::ModelProto{});
  try {
    graph = OnnxGraph::parse(data, size, "fuzz input");
  } catch (const mqbench::Error&) {
    return -1;  // not a model: keep it out of the corpus
  }
  DeployOptions options;
  options.model_name = "fuzz";
  options.deploy_to_qlinear = true;
  options.allow_float_layers = true;  // the Tensorrt translators' files, not their refusal
  for (const auto& backend : backends()) {
    mqbench::deploy::DeployOutput out;
    try {
      out = mqbench::deploy::translate(graph, backend, options);
    } catch (const mqbench::Error&) {
      continue;  // the contract: an error with a message
    }
    check_artifacts(backend, out);
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  Rng rng(seed);
  onnx::ModelProto m;
  if (pick(rng, 8) == 0 || !m.ParseFromArray(data, static_cast<int>(size))) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  const size_t rounds = 1 + pick(rng, 3);
  for (size_t i = 0; i < rounds; ++i) mutate_model(m, rng);
  std::string bytes;
  if (!m.SerializeToString(&bytes) || bytes.size() > max_size) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  std::memcpy(data, bytes.data(), bytes.size());
  return bytes.size();
}
