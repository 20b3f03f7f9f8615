// pybind11 glue for the backend registry (include/mqbench/backend.h). Specs cross as dicts;
// registry errors become ValueError.

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "errors.h"
#include "mqbench/backend.h"

namespace py = pybind11;

namespace mqbench {
namespace python {
namespace {

py::object scheme_to_dict(const std::optional<QuantizeScheme>& s) {
  if (!s) return py::none();
  py::dict d;
  d["symmetry"] = s->symmetry;
  d["per_channel"] = s->per_channel;
  d["pot_scale"] = s->pot_scale;
  d["bit"] = s->bit;
  d["symmetric_range"] = s->symmetric_range;
  d["kwargs"] = s->kwargs;
  d["dtype"] = s->dtype;
  d["group_size"] = s->group_size;
  return std::move(d);
}

std::optional<QuantizeScheme> scheme_from(const py::object& o) {
  if (o.is_none()) return std::nullopt;
  auto d = o.cast<py::dict>();
  QuantizeScheme s;
  s.symmetry = d["symmetry"].cast<bool>();
  s.per_channel = d["per_channel"].cast<bool>();
  s.pot_scale = d["pot_scale"].cast<bool>();
  s.bit = d["bit"].cast<int64_t>();
  s.symmetric_range = d.contains("symmetric_range") && d["symmetric_range"].cast<bool>();
  if (d.contains("kwargs")) s.kwargs = d["kwargs"].cast<std::map<std::string, double>>();
  if (d.contains("dtype")) s.dtype = d["dtype"].cast<std::string>();
  if (d.contains("group_size") && !d["group_size"].is_none())
    s.group_size = d["group_size"].cast<int64_t>();
  s.validate();
  return s;
}

py::dict spec_to_dict(const BackendSpec& s) {
  py::dict d;
  d["name"] = s.name;
  d["qtype"] = s.qtype;
  d["w_qscheme"] = scheme_to_dict(s.weight_scheme);
  d["a_qscheme"] = scheme_to_dict(s.activation_scheme);
  d["default_weight_quantize"] = s.weight_fake_quantize;
  d["default_act_quantize"] = s.activation_fake_quantize;
  d["default_weight_observer"] = s.weight_observer;
  d["default_act_observer"] = s.activation_observer;
  d["model_quantizer"] = s.model_quantizer;
  d["deploy_translator"] = s.deploy_translator;
  d["params_of"] = s.params_of;
  d["order"] = s.order;
  return d;
}

void register_from_dict(const py::dict& d) {
  BackendSpec s;
  s.name = d["name"].cast<std::string>();
  auto str = [&](const char* key, std::string& out) {
    if (d.contains(key) && !d[key].is_none()) out = d[key].cast<std::string>();
  };
  str("qtype", s.qtype);
  str("default_weight_quantize", s.weight_fake_quantize);
  str("default_act_quantize", s.activation_fake_quantize);
  str("default_weight_observer", s.weight_observer);
  str("default_act_observer", s.activation_observer);
  str("model_quantizer", s.model_quantizer);
  str("deploy_translator", s.deploy_translator);
  str("params_of", s.params_of);
  if (d.contains("w_qscheme")) s.weight_scheme = scheme_from(d["w_qscheme"]);
  if (d.contains("a_qscheme")) s.activation_scheme = scheme_from(d["a_qscheme"]);
  if (d.contains("order")) s.order = d["order"].cast<int>();
  register_backend(std::move(s));
}

}  // namespace

void bind_backends(py::module_& m) {
  m.def("backend_names", [] { return backend_names(); },
        "Registered backend names, in BackendType order.");
  m.def("get_backend", [](const std::string& name) {
    return as_value_error([&] { return spec_to_dict(get_backend(name)); });
  }, "The spec of a backend as a dict (params_of resolved). Unknown names raise ValueError.");
  m.def("register_backend", [](const py::dict& d) {
    as_value_error([&] { register_from_dict(d); });
  }, "Registers a backend spec given as a dict (keys as get_backend returns them).");
  m.def("fake_quantize_names", [] { return fake_quantize_names(); });
  m.def("observer_names", [] { return observer_names(); });
  m.def("register_fake_quantize_name", [](const std::string& n) {
    as_value_error([&] { register_fake_quantize_name(n); });
  });
  m.def("register_observer_name", [](const std::string& n) {
    as_value_error([&] { register_observer_name(n); });
  });
}

}  // namespace python
}  // namespace mqbench
