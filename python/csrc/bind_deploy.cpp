// Deploy passes (mqbench/deploy/*.h) for mqbench.convert_deploy. ONNX crosses as bytes; the
// C++ work runs without the GIL. DeployError (and every mqbench::Error) becomes ValueError.
// Compiled without torch's include folders (CMakeLists.txt: mqbench_python_deploy), as every
// user of the ONNX protobuf classes is.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <set>

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

// Raised out of a Python callback that failed, through the C++ translator; the Python error
// itself waits in a PendingError until the GIL is held again.
struct CallbackFailed : std::exception {
  const char* what() const noexcept override { return "a Python callback raised"; }
};
struct PendingError {
  std::unique_ptr<py::error_already_set> error;  // what the callback raised
  bool returned = false;  // it returned a table: a later C++ error may be about that table
};

// The translators' post_process_clip_ranges step as a call of `fn(ranges_json, model_bytes)
// -> (ranges_json, model_bytes)` (mqbench.deploy.deploy_linear), made with the GIL held. The
// function holds `fn` borrowed (the caller keeps it alive), so copying it without the GIL is safe.
std::function<std::string(const std::string&, std::string*)> ranges_callback(py::handle fn,
                                                                            PendingError* pending) {
  return [fn, pending](const std::string& ranges, std::string* model) -> std::string {
    py::gil_scoped_acquire gil;
    try {
      py::tuple r = fn(py::str(ranges), py::bytes(*model));
      if (r.size() != 2) throw py::value_error("the callback must return (ranges_json, model_bytes)");
      *model = r[1].cast<std::string>();
      std::string table = r[0].cast<std::string>();
      pending->returned = true;
      return table;
    } catch (py::error_already_set& e) {
      pending->error = std::make_unique<py::error_already_set>(std::move(e));
    } catch (const py::cast_error& e) {  // a builtin_exception, raised as TypeError here
      PyErr_SetString(PyExc_TypeError, (std::string("post_process_clip_ranges: ") + e.what()).c_str());
      pending->error = std::make_unique<py::error_already_set>();
    } catch (const py::builtin_exception& e) {
      e.set_error();
      pending->error = std::make_unique<py::error_already_set>();
    }
    throw CallbackFailed();
  };
}

deploy::DeployOptions options(const std::string& model_name, const std::string& output_dir, bool qlinear,
                              bool allow_float_layers) {
  deploy::DeployOptions o;
  o.model_name = model_name;
  o.output_dir = output_dir;
  o.deploy_to_qlinear = qlinear;
  o.allow_float_layers = allow_float_layers;
  return o;
}

// Runs `translator` on the serialized model held by `model` (read in place, without the GIL;
// the caller's reference keeps the buffer alive). With a non-empty `output_dir`, the directory is
// checked first and the files are written there atomically; `written` receives their paths.
// With `require_fake_quant`, a model without fake-quantize nodes is refused (mqbench.deploy's
// steps: deploying such a model is a mistake, not a no-op). With `pending` set, `o` may hold a
// Python callback: a Python error it raised is raised again here, and an error in reading what
// it returned becomes ValueError.
deploy::DeployOutput translate(const py::bytes& model, const std::string& translator,
                               const deploy::DeployOptions& o, bool write,
                               std::vector<std::string>* written, bool require_fake_quant = false,
                               PendingError* pending = nullptr,
                               std::vector<deploy::PassRecord>* passes = nullptr) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(model.ptr(), &data, &size) != 0) throw py::error_already_set();
  deploy::DeployOutput out;
  try {
    deploy_errors([&] {
      py::gil_scoped_release release;
      deploy::check_file_name(o.model_name, "model_name");
      if (write) deploy::check_output_dir(o.output_dir);
      auto g = deploy::OnnxGraph::parse(data, static_cast<size_t>(size));
      if (require_fake_quant) g.check_structure("input model");
      if (require_fake_quant && deploy::find_fake_quants(g).empty()) {
        throw deploy::DeployError("the model has no fake-quantize nodes: deploy steps take the "
                                  "ONNX exported from a prepared, calibrated model "
                                  "(convert_deploy writes it as <model_name>.onnx)");
      }
      out = deploy::run_translator(translator, std::move(g), o, passes);
      if (write) *written = deploy::write_atomically(o.output_dir, out.files);
      return 0;
    });
  } catch (const CallbackFailed&) {
    auto e = std::move(pending->error);
    throw py::error_already_set(std::move(*e));
  } catch (const py::error_already_set&) {
    throw;
  } catch (const py::builtin_exception&) {  // deploy_errors' ValueError
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    if (pending == nullptr || !pending->returned) throw;
    // What the callback returned, read by the translator (nlohmann's type errors).
    throw py::value_error(std::string("post_process_clip_ranges returned a table the ") +
                          translator + " translator cannot read: " + e.what());
  }
  return out;
}

// Appends (name, nodes before, nodes after, milliseconds) for each pass run to `sink` (a list,
// or None for nothing).
void report_passes(const std::vector<deploy::PassRecord>& passes, const py::object& sink) {
  if (sink.is_none()) return;
  py::list list = sink.cast<py::list>();
  for (const auto& p : passes) {
    list.append(py::make_tuple(p.name, p.nodes_before, p.nodes_after, p.milliseconds));
  }
}

py::dict files_dict(const deploy::DeployOutput& out) {
  py::dict files;
  for (const auto& f : out.files) files[py::str(f.file_name)] = py::bytes(f.contents);
  return files;
}

}  // namespace

void bind_deploy(py::module_& m) {
  m.def("deploy_translate", [](const py::bytes& model, const std::string& translator,
                               const std::string& model_name, bool qlinear,
                               const py::object& post_process_clip_ranges, bool require_fake_quant,
                               const py::object& passes, bool allow_float_layers) {
    auto o = options(model_name, ".", qlinear, allow_float_layers);
    PendingError pending;
    if (!post_process_clip_ranges.is_none()) {
      o.post_process_clip_ranges = ranges_callback(post_process_clip_ranges, &pending);
    }
    std::vector<deploy::PassRecord> ran;
    const auto out = translate(model, translator, o, false, nullptr, require_fake_quant,
                               post_process_clip_ranges.is_none() ? nullptr : &pending, &ran);
    report_passes(ran, passes);
    return py::make_tuple(files_dict(out), out.notes);
  }, py::arg("model"), py::arg("translator"), py::arg("model_name") = "mqbench_qmodel",
     py::arg("deploy_to_qlinear") = false, py::arg("post_process_clip_ranges") = py::none(),
     py::arg("require_fake_quant") = false, py::arg("passes") = py::none(),
     py::arg("allow_float_layers") = false,
     "Runs the deploy translator `translator` on serialized ONNX; returns ({file name: bytes}, "
     "notes) without writing anything. `post_process_clip_ranges(ranges_json, model_bytes) -> "
     "(ranges_json, model_bytes)` replaces the translator's step of that name (tensorrt, snpe, "
     "pplw8a16, pplcuda, vitis, tengine_u8, stpu); `require_fake_quant` refuses a model without "
     "fake-quantize nodes. `passes`, a list, receives (name, nodes before, nodes after, "
     "milliseconds) for each deploy pass run (mqbench/deploy/pass.h). `allow_float_layers` "
     "(tensorrt, tensorrt_nlp): deploy layers with a quantized weight and a float input, named "
     "in a note starting 'warning: ', instead of raising ValueError.");
  m.def("deploy_preprocess", [](const py::bytes& model, const std::string& pass) {
    const std::string bytes = model;
    return py::bytes(deploy_errors([&] {
      py::gil_scoped_release release;
      auto g = deploy::OnnxGraph::parse(bytes);
      g.check_structure("input model");
      if (pass == "remove_zero_pads") {
        deploy::remove_zero_pads(g);
      } else if (pass == "resize_to_upsample") {
        deploy::resize_to_upsample(g);
      } else {
        throw deploy::DeployError("unknown preprocess pass '" + pass +
                                  "'; the passes are remove_zero_pads, resize_to_upsample");
      }
      return g.serialize();
    }));
  }, py::arg("model"), py::arg("pass"),
     "Runs one preprocess pass of the translators (remove_zero_pads: MQBench's "
     "remove_fake_pad_op; resize_to_upsample: its replace_resize_op_with_upsample) on serialized "
     "ONNX and returns the result.");
  m.def("deploy_post_process_clip_ranges", [](const py::bytes& model, const std::vector<std::string>& has) {
    const std::string bytes = model;
    return deploy_errors([&] {
      py::gil_scoped_release release;
      const auto g = deploy::OnnxGraph::parse(bytes);
      return deploy::post_process_clip_ranges(g, std::set<std::string>(has.begin(), has.end()));
    });
  }, py::arg("model"), py::arg("has"),
     "MQBench's post_process_clip_ranges rule on serialized ONNX: the (to, from) tensor pairs, "
     "in order, whose ranges to copy, for the tensors `has` that have one.");
  m.def("deploy_run", [](const py::bytes& model, const std::string& translator,
                         const std::string& model_name, const std::string& output_dir, bool qlinear,
                         const py::object& passes, bool allow_float_layers) {
    std::vector<std::string> written;
    std::vector<deploy::PassRecord> ran;
    const auto out = translate(model, translator,
                               options(model_name, output_dir, qlinear, allow_float_layers), true,
                               &written, false, nullptr, &ran);
    report_passes(ran, passes);
    return py::make_tuple(written, out.notes);
  }, py::arg("model"), py::arg("translator"), py::arg("model_name"), py::arg("output_dir"),
     py::arg("deploy_to_qlinear") = false, py::arg("passes") = py::none(),
     py::arg("allow_float_layers") = false,
     "Runs the deploy translator `translator` on serialized ONNX and writes its files into "
     "output_dir atomically; returns (paths written, notes). `passes`, a list, receives (name, "
     "nodes before, nodes after, milliseconds) for each deploy pass run. `allow_float_layers` as "
     "deploy_translate's.");
  m.def("deploy_pass_names", [] { return deploy::pass_names(); },
        "The names of the registered deploy passes (one file each under src/deploy/passes/).");
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
      g.check_structure("input model");
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
        d["format"] = fq.q.format == deploy::QFormat::kFp8E4M3 ? "fp8_e4m3"
                    : fq.q.format == deploy::QFormat::kFp8E5M2 ? "fp8_e5m2" : "int";
        d["block_size"] = fq.q.block_size;
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
