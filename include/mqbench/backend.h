#pragma once
// The backend registry: one BackendSpec per deploy target (MQBench's BackendType and
// ParamsTable in one place). Each built-in backend is one file under src/backends/ that
// registers its spec at load time; an application registers its own the same way
// (docs/add_a_backend.md):
//
//   MQBENCH_REGISTER_BACKEND(my_chip, [] {
//     mqbench::BackendSpec s;
//     s.name = "MyChip";
//     s.qtype = "affine";
//     s.weight_scheme = mqbench::QuantizeScheme{true, true, false, 8, true};
//     s.activation_scheme = mqbench::QuantizeScheme{true, false, false, 8, true};
//     s.weight_fake_quantize = s.activation_fake_quantize = "LearnableFakeQuantize";
//     s.weight_observer = "MinMaxObserver";
//     s.activation_observer = "EMAMinMaxObserver";
//     s.model_quantizer = "ModelQuantizer";
//     return s;
//   }());

#include <optional>

#include <string>
#include <vector>

#include "mqbench/error.h"
#include "mqbench/scheme.h"

namespace mqbench {

struct BackendSpec {
  std::string name;
  /// "affine", "nnie" or "vitis" (MQBench's qtype).
  std::string qtype = "affine";
  /// Empty for Academic-style backends, where the user must supply w_qscheme / a_qscheme.
  std::optional<QuantizeScheme> weight_scheme, activation_scheme;
  /// Names from the fake-quantize and observer registries; empty when the user must choose.
  std::string weight_fake_quantize, activation_fake_quantize;
  std::string weight_observer, activation_observer;
  /// The quantizer rules that place quant nodes (the ModelQuantizer issue fills the rules).
  std::string model_quantizer = "ModelQuantizer";
  /// The deploy translator that writes the backend's artifacts (mqbench/deploy/deploy.h;
  /// empty: the backend has no deploy step of its own).
  std::string deploy_translator;
  /// Another backend whose parameters this one shares (MQBench: Tensorrt_NLP -> Tensorrt).
  std::string params_of;
  /// Position in BackendType (built-ins use MQBench's enum order; others sort after them, in
  /// registration order).
  int order = 1000;
  /// Backend that the user must give qschemes for (Academic, Academic_NLP).
  bool requires_user_qscheme() const { return !weight_scheme.has_value(); }
};

/// Registers `spec`. Raises if the name is empty, already registered, or names an unknown
/// fake quantizer / observer / params_of backend.
void register_backend(BackendSpec spec);

/// The spec of `name`; raises listing the registered names when there is none. A backend with
/// `params_of` set reports that backend's schemes, quantizers and observers.
BackendSpec get_backend(const std::string& name);

/// Registered backend names, sorted by `order`, then registration order.
std::vector<std::string> backend_names();

/// Names of the fake quantizers and observers that specs may refer to (MQBench's
/// FakeQuantizeDict / ObserverDict keys, plus the LSQPlusObserver and PoTModeObserver classes).
const std::vector<std::string>& fake_quantize_names();
const std::vector<std::string>& observer_names();

/// Adds a fake quantizer or observer name (a class defined outside the library, e.g. in
/// Python); raises on a duplicate.
void register_fake_quantize_name(const std::string& name);
void register_observer_name(const std::string& name);

namespace detail {
struct BackendRegisterer {
  explicit BackendRegisterer(BackendSpec spec) { register_backend(std::move(spec)); }
};
}  // namespace detail

}  // namespace mqbench

/// Registers a BackendSpec expression at load time; `id` names the static registrar.
#define MQBENCH_REGISTER_BACKEND(id, ...) \
  static ::mqbench::detail::BackendRegisterer mqbench_backend_registerer_##id(__VA_ARGS__)
