// Deploy passes (mqbench/deploy/*.h) for mqbench.convert_deploy. ONNX crosses as bytes; the
// C++ work runs without the GIL. DeployError (and every mqbench::Error) becomes ValueError.
// Compiled without torch's include folders (CMakeLists.txt: mqbench_python_deploy), as every
// user of the ONNX protobuf classes is.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mqbench/deploy/translator.h"

namespace py = pybind11;

namespace mqbench {
namespace python {
namespace {

template <typename F>
auto deploy_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

deploy::DeployOptions options(const std::string& model_name, const std::string& output_dir, bool qlinear) {
  deploy::DeployOptions o;
  o.model_name = model_name;
  o.output_dir = output_dir;
  o.deploy_to_qlinear = qlinear;
  return o;
}

// Runs `translator` on the serialized model held by `model` (read in place, without the GIL;
// the caller's reference keeps the buffer alive). With a non-empty `output_dir`, the directory is
// checked first and the files are written there atomically; `written` receives their paths.
deploy::DeployOutput translate(const py::bytes& model, const std::string& translator,
                               const deploy::DeployOptions& o, bool write,
                               std::vector<std::string>* written) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(model.ptr(), &data, &size) != 0) throw py::error_already_set();
  deploy::DeployOutput out;
  deploy_errors([&] {
    py::gil_scoped_release release;
    deploy::check_file_name(o.model_name, "model_name");
    if (write) deploy::check_output_dir(o.output_dir);
    auto g = deploy::OnnxGraph::parse(data, static_cast<size_t>(size));
    out = deploy::run_translator(translator, std::move(g), o);
    if (write) *written = deploy::write_atomically(o.output_dir, out.files);
    return 0;
  });
  return out;
}

py::dict files_dict(const deploy::DeployOutput& out) {
  py::dict files;
  for (const auto& f : out.files) files[py::str(f.file_name)] = py::bytes(f.contents);
  return files;
}

}  // namespace

void bind_deploy(py::module_& m) {
  m.def("deploy_translate", [](const py::bytes& model, const std::string& translator,
                               const std::string& model_name, bool qlinear) {
    const auto out = translate(model, translator, options(model_name, ".", qlinear), false, nullptr);
    return py::make_tuple(files_dict(out), out.notes);
  }, py::arg("model"), py::arg("translator"), py::arg("model_name") = "mqbench_qmodel",
     py::arg("deploy_to_qlinear") = false,
     "Runs the deploy translator `translator` on serialized ONNX; returns ({file name: bytes}, "
     "notes) without writing anything.");
  m.def("deploy_run", [](const py::bytes& model, const std::string& translator,
                         const std::string& model_name, const std::string& output_dir, bool qlinear) {
    std::vector<std::string> written;
    const auto out = translate(model, translator, options(model_name, output_dir, qlinear), true, &written);
    return py::make_tuple(written, out.notes);
  }, py::arg("model"), py::arg("translator"), py::arg("model_name"), py::arg("output_dir"),
     py::arg("deploy_to_qlinear") = false,
     "Runs the deploy translator `translator` on serialized ONNX and writes its files into "
     "output_dir atomically; returns (paths written, notes).");
  m.def("deploy_write", [](const std::string& output_dir, const py::dict& files) {
    std::vector<deploy::Artifact> artifacts;
    for (const auto& kv : files) {
      artifacts.push_back({kv.first.cast<std::string>(), kv.second.cast<std::string>()});
    }
    return deploy_errors([&] {
      py::gil_scoped_release release;
      return deploy::write_atomically(output_dir, artifacts);
    });
  }, py::arg("output_dir"), py::arg("files"),
     "Writes {file name: bytes} into output_dir atomically (temporary files, then renames); "
     "returns the paths written.");
  m.def("deploy_check_file_name", [](const std::string& name, const std::string& what) {
    deploy_errors([&] { deploy::check_file_name(name, what.c_str()); return 0; });
  }, py::arg("name"), py::arg("what") = "model_name",
     "Raises ValueError unless `name` is one file name (1-200 characters, no '/', no NUL, not "
     "'.' or '..').");
  m.def("deploy_check_output_dir", [](const std::string& dir) {
    deploy_errors([&] { deploy::check_output_dir(dir); return 0; });
  }, py::arg("output_dir"), "Creates output_dir if needed; raises ValueError when it is not writable.");
  m.def("deploy_translator_of", [](const std::string& backend) {
    return deploy_errors([&] { return deploy::translator_of_backend(backend); });
  }, py::arg("backend"), "The deploy translator named by a backend's BackendSpec.");
  m.def("deploy_translator_names", &deploy::translator_names);
  m.def("deploy_fake_quant_params", [](const py::bytes& model) {
    const std::string bytes = model;
    return deploy_errors([&] {
      const auto g = deploy::OnnxGraph::parse(bytes);
      py::list out;
      for (const auto& fq : deploy::find_fake_quants(g)) {
        py::dict d;
        d["name"] = fq.name;
        d["op_type"] = fq.op_type;
        d["input"] = fq.input;
        d["output"] = fq.output;
        d["role"] = deploy::role_name(deploy::classify(g, fq));
        d["scale"] = fq.q.scale;
        d["zero_point"] = fq.q.zero_point;
        d["quant_min"] = fq.q.quant_min;
        d["quant_max"] = fq.q.quant_max;
        d["axis"] = fq.q.axis;
        d["nnie"] = fq.nnie;
        d["data_max"] = fq.data_max;
        out.append(d);
      }
      return out;
    });
  }, py::arg("model"), "The fake-quantize groups of serialized ONNX with their parameters and roles.");
}

}  // namespace python
}  // namespace mqbench
