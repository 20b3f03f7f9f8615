// mqbench-deploy: turns an ONNX file with fake-quantize nodes (exported by mqbench's
// convert_deploy / torch.onnx.export, or by MQBench itself) into a backend's deploy artifacts.
// No Python involved, but for `check`, which hands over to Python's mqbench.deploy.check (the
// runtimes it runs the files in, onnxruntime and OpenVINO, are Python packages there; torch is
// not needed).
//
//   mqbench-deploy --backend Tensorrt --output-dir out [--model-name NAME] [--deploy-to-qlinear]
//                  [--allow-float-layers] [--verbose] MODEL.onnx
//   mqbench-deploy --inspect MODEL.onnx
//   mqbench-deploy --list-backends
//   mqbench-deploy --list-passes
//   mqbench-deploy check MODEL.onnx --reference FAKE_QUANT.onnx --inputs X.npy [...]
//
// Exit status: 0 on success, 1 when the deploy fails (bad model, unwritable output...), 2 on
// bad usage.

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <cerrno>
#include <cstdlib>
#include <unistd.h>


#include "mqbench/backend.h"
#include "mqbench/deploy/translator.h"

namespace {

const char* kUsage =
    "usage: mqbench-deploy --backend NAME [--output-dir DIR] [--model-name NAME]\n"
    "                      [--deploy-to-qlinear] [--allow-float-layers] [--verbose] MODEL.onnx\n"
    "       mqbench-deploy --inspect MODEL.onnx\n"
    "       mqbench-deploy --list-backends\n"
    "       mqbench-deploy --list-passes\n"
    "       mqbench-deploy check MODEL.onnx --reference FAKE_QUANT.onnx --inputs X.npy [...]\n"
    "\n"
    "Removes the fake-quantize nodes of MODEL.onnx and writes the backend's files (MQBench's\n"
    "names and layouts, e.g. NAME_deploy_model.onnx, NAME_clip_ranges.json and the TensorRT\n"
    "calibration cache NAME_calib.cache for Tensorrt)\n"
    "into DIR (default: the current directory). NAME defaults to MODEL's file name without\n"
    ".onnx. Every file is written to a temporary name first and renamed into place.\n"
    "--verbose prints each deploy pass run (\"pass NAME: BEFORE -> AFTER nodes, MS ms\");\n"
    "--list-passes lists the passes by name.\n"
    "Tensorrt and Tensorrt_NLP refuse a model with a layer whose weight is quantized but whose\n"
    "input is not (TensorRT would run it in float); --allow-float-layers deploys it anyway and\n"
    "prints a warning naming those layers.\n";

int usage_error(const std::string& msg) {
  std::cerr << "mqbench-deploy: " << msg << "\n\n" << kUsage;
  return 2;
}

std::string stem(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".onnx") == 0) base.resize(base.size() - 5);
  return base;
}

void inspect(const std::string& path) {
  using namespace mqbench::deploy;
  const auto g = OnnxGraph::load(path);
  g.check_structure("input model");  // a node without its inputs or outputs is read below
  const auto fqs = find_fake_quants(g);
  std::printf("%s: %d nodes, %zu fake-quantize groups\n", path.c_str(), g.graph().node_size(), fqs.size());
  for (const auto& fq : fqs) {
    const Role role = classify(g, fq);
    if (fq.nnie) {
      std::printf("  %-10s %-40s %s data_max=%g\n", role_name(role), fq.input.c_str(), fq.op_type.c_str(), fq.data_max);
      continue;
    }
    const auto& q = fq.q;
    if (q.is_format()) {
      std::printf("  %-10s %-40s %s %s\n", role_name(role), fq.input.c_str(), fq.op_type.c_str(),
                  q.describe().c_str());
      continue;
    }
    std::printf("  %-10s %-40s %s [%lld, %lld]", role_name(role), fq.input.c_str(), fq.op_type.c_str(),
                static_cast<long long>(q.quant_min), static_cast<long long>(q.quant_max));
    if (q.per_channel()) {
      std::printf(" per-channel axis=%lld (%zu channels)\n", static_cast<long long>(q.axis), q.scale.size());
    } else {
      std::printf(" scale=%g zero_point=%lld\n", q.scale[0], static_cast<long long>(q.zero_point[0]));
    }
  }
}

}  // namespace

// `mqbench-deploy check ...`: replaces this process with
// `$MQBENCH_PYTHON -m mqbench.deploy.check ...` (python3 by default), which prints the report and
// exits 0 when the file agrees with the reference, 1 when it departs or the check fails.
static int run_check(int argc, char** argv) {
  const char* env = std::getenv("MQBENCH_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  std::vector<std::string> args = {python, "-m", "mqbench.deploy.check"};
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execvp(cargs[0], cargs.data());
  const int err = errno;
  std::cerr << "mqbench-deploy: check runs Python's mqbench.deploy.check and could not start '"
            << python << "': " << std::strerror(err)
            << " (set MQBENCH_PYTHON to a Python with mqbench, onnx and onnxruntime)\n";
  return 1;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "check") == 0) return run_check(argc, argv);
  std::string backend, output_dir = ".", model_name, input;
  bool qlinear = false, do_inspect = false, verbose = false, allow_float_layers = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      } else if (a == "--backend" || a == "-b") {
        backend = value("--backend");
      } else if (a == "--output-dir" || a == "-o") {
        output_dir = value("--output-dir");
      } else if (a == "--model-name" || a == "-n") {
        model_name = value("--model-name");
      } else if (a == "--deploy-to-qlinear") {
        qlinear = true;
      } else if (a == "--allow-float-layers") {
        allow_float_layers = true;
      } else if (a == "--inspect") {
        do_inspect = true;
      } else if (a == "--verbose" || a == "-v") {
        verbose = true;
      } else if (a == "--list-passes") {
        for (const auto& name : mqbench::deploy::pass_names()) {
          std::cout << name << "\t" << mqbench::deploy::pass_description(name) << "\n";
        }
        return 0;
      } else if (a == "--list-backends") {
        for (const auto& name : mqbench::backend_names()) {
          std::cout << name << "\t" << mqbench::get_backend(name).deploy_translator << "\n";
        }
        return 0;
      } else if (!a.empty() && a[0] == '-') {
        return usage_error("unknown option " + a);
      } else if (input.empty()) {
        input = a;
      } else {
        return usage_error("more than one model given (" + input + ", " + a + ")");
      }
    } catch (const std::invalid_argument& e) {
      return usage_error(e.what());
    }
  }
  if (input.empty()) return usage_error("no model given");
  try {
    if (do_inspect) {
      inspect(input);
      return 0;
    }
    if (backend.empty()) return usage_error("--backend is required (see --list-backends)");
    mqbench::deploy::DeployOptions options;
    options.output_dir = output_dir;
    options.model_name = model_name.empty() ? stem(input) : model_name;
    options.deploy_to_qlinear = qlinear;
    options.allow_float_layers = allow_float_layers;
    std::vector<std::string> notes;
    std::vector<mqbench::deploy::PassRecord> passes;
    const auto written = mqbench::deploy::deploy_file(input, backend, options, &notes, &passes);
    if (verbose) {
      for (const auto& p : passes) {
        char ms[32];
        std::snprintf(ms, sizeof(ms), "%.1f", p.milliseconds);
        std::cout << "pass " << p.name << ": " << p.nodes_before << " -> " << p.nodes_after
                  << " nodes, " << ms << " ms\n";
      }
    }
    for (const auto& f : written) std::cout << "wrote " << f << "\n";
    for (const auto& n : notes) {
      // a note that starts "warning: " (allowed float layers) goes to stderr as it is
      if (n.rfind("warning: ", 0) == 0) {
        std::cerr << "mqbench-deploy: " << n << "\n";
      } else {
        std::cout << "note: " << n << "\n";
      }
    }
    return 0;
  } catch (const std::exception& e) {  // DeployError, mqbench::Error, or anything below them
    std::cerr << "mqbench-deploy: " << e.what() << "\n";
    return 1;
  }
}
