#pragma once
// Shorthand for the built-in backend files of this folder: one call per backend.

#include "mqbench/backend.h"

namespace mqbench {
namespace backends {

struct Defaults {
  const char* weight_fake_quantize;
  const char* activation_fake_quantize;
  const char* weight_observer;
  const char* activation_observer;
};

inline BackendSpec builtin(const char* name, int order, const char* qtype, QuantizeScheme w,
                           QuantizeScheme a, Defaults d, const char* model_quantizer,
                           const char* deploy_translator) {
  BackendSpec s;
  s.name = name;
  s.order = order;
  s.qtype = qtype;
  s.weight_scheme = std::move(w);
  s.activation_scheme = std::move(a);
  s.weight_fake_quantize = d.weight_fake_quantize;
  s.activation_fake_quantize = d.activation_fake_quantize;
  s.weight_observer = d.weight_observer;
  s.activation_observer = d.activation_observer;
  s.model_quantizer = model_quantizer;
  s.deploy_translator = deploy_translator;
  return s;
}

/// A backend that shares another's schemes, quantizers and observers (params_of), or, with
/// params_of empty, leaves them all to the user (Academic).
inline BackendSpec alias(const char* name, int order, const char* params_of,
                         const char* model_quantizer, const char* deploy_translator) {
  BackendSpec s;
  s.name = name;
  s.order = order;
  s.params_of = params_of;
  s.model_quantizer = model_quantizer;
  s.deploy_translator = deploy_translator;
  return s;
}

// Symmetric / asymmetric 8-bit schemes: {symmetry, per_channel, pot_scale, bit, symmetric_range}.
inline QuantizeScheme sym(bool per_channel, bool symmetric_range = false, bool pot = false) {
  return QuantizeScheme{true, per_channel, pot, 8, symmetric_range, {}};
}
inline QuantizeScheme asym(bool per_channel, int64_t bit = 8) {
  return QuantizeScheme{false, per_channel, false, bit, false, {}};
}

constexpr Defaults kLsqMinMaxEma{"LearnableFakeQuantize", "LearnableFakeQuantize",
                                 "MinMaxObserver", "EMAMinMaxObserver"};
constexpr Defaults kLsqMinMax{"LearnableFakeQuantize", "LearnableFakeQuantize", "MinMaxObserver",
                              "MinMaxObserver"};

}  // namespace backends
}  // namespace mqbench
