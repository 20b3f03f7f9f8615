// The backend registry (include/mqbench/backend.h). Built-in backends register themselves from
// their own files in this folder; the registry itself knows none of them.

#include "mqbench/error.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include "mqbench/backend.h"

namespace mqbench {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<BackendSpec> specs;  // registration order
  std::vector<std::string> fake_quantizes{
      "FixedFakeQuantize", "LearnableFakeQuantize", "NNIEFakeQuantize",
      "DoReFaFakeQuantize", "DSQFakeQuantize", "PACTFakeQuantize",
      "TqtFakeQuantize", "AdaRoundFakeQuantize", "QDropFakeQuantize"};
  std::vector<std::string> observers{
      "MinMaxObserver", "EMAMinMaxObserver", "MinMaxFloorObserver", "PoTModeObserver",
      "EMAQuantileObserver", "ClipStdObserver", "LSQObserver", "LSQPlusObserver",
      "MSEObserver", "EMAMSEObserver"};
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& names) {
  std::ostringstream s;
  for (size_t i = 0; i < names.size(); ++i) s << (i ? ", " : "") << names[i];
  return s.str();
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

void check_name(const std::vector<std::string>& valid, const std::string& name, const char* what,
                const std::string& backend) {
  MQBENCH_CHECK(name.empty() || contains(valid, name), "register_backend(", backend, "): unknown ",
                what, " '", name, "'; valid names: ", join(valid));
}

const BackendSpec* find(const Registry& r, const std::string& name) {
  for (const auto& s : r.specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<std::string> sorted_names(const Registry& r) {
  std::vector<size_t> idx(r.specs.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return r.specs[a].order < r.specs[b].order; });
  std::vector<std::string> out;
  for (auto i : idx) out.push_back(r.specs[i].name);
  return out;
}

void add_name(std::vector<std::string>& v, const std::string& name, const char* what) {
  MQBENCH_CHECK(!name.empty(), "register_", what, "_name: the name is empty");
  MQBENCH_CHECK(!contains(v, name), "register_", what, "_name: '", name,
                "' is already registered");
  v.push_back(name);
}

}  // namespace

void register_backend(BackendSpec spec) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  MQBENCH_CHECK(!spec.name.empty(), "register_backend: the backend name is empty");
  MQBENCH_CHECK(find(r, spec.name) == nullptr, "register_backend: a backend named '", spec.name,
                "' is already registered (registered: ", join(sorted_names(r)), ")");
  MQBENCH_CHECK(spec.qtype == "affine" || spec.qtype == "nnie" || spec.qtype == "vitis",
                "register_backend(", spec.name,
                "): qtype must be 'affine', 'nnie' or 'vitis', got '",
                spec.qtype, "'");
  MQBENCH_CHECK(spec.weight_scheme.has_value() == spec.activation_scheme.has_value(),
                "register_backend(", spec.name, "): give both weight and activation schemes, or "
                "neither (the user then supplies them)");
  check_name(r.fake_quantizes, spec.weight_fake_quantize, "fake quantizer", spec.name);
  check_name(r.fake_quantizes, spec.activation_fake_quantize, "fake quantizer", spec.name);
  check_name(r.observers, spec.weight_observer, "observer", spec.name);
  check_name(r.observers, spec.activation_observer, "observer", spec.name);
  if (!spec.params_of.empty()) {
    // Static registration order between files is unspecified, so params_of is resolved at
    // lookup; only a self-reference can be refused here.
    MQBENCH_CHECK(spec.params_of != spec.name, "register_backend(", spec.name,
                  "): params_of cannot name the backend itself");
  }
  r.specs.push_back(std::move(spec));
}

BackendSpec get_backend(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const BackendSpec* s = find(r, name);
  MQBENCH_CHECK(s != nullptr, "unknown backend '", name, "'; registered backends: ",
                join(sorted_names(r)));
  BackendSpec out = *s;
  if (!s->params_of.empty()) {
    const BackendSpec* base = find(r, s->params_of);
    MQBENCH_CHECK(base != nullptr, "backend '", name, "' shares the parameters of '", s->params_of,
                  "', which is not registered");
    out.qtype = base->qtype;
    out.weight_scheme = base->weight_scheme;
    out.activation_scheme = base->activation_scheme;
    out.weight_fake_quantize = base->weight_fake_quantize;
    out.activation_fake_quantize = base->activation_fake_quantize;
    out.weight_observer = base->weight_observer;
    out.activation_observer = base->activation_observer;
  }
  return out;
}

std::vector<std::string> backend_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return sorted_names(r);
}

const std::vector<std::string>& fake_quantize_names() { return registry().fake_quantizes; }
const std::vector<std::string>& observer_names() { return registry().observers; }

void register_fake_quantize_name(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  add_name(r.fake_quantizes, name, "fake_quantize");
}

void register_observer_name(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  add_name(r.observers, name, "observer");
}

}  // namespace mqbench
