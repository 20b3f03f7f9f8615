// get_qconfig (include/mqbench/qconfig.h): MQBench's get_qconfig_by_platform over the C++
// backend registry and the C++ fake quantizers and observers.

#include "mqbench/qconfig.h"

#include <c10/util/Exception.h>

#include "mqbench/backend.h"

namespace mqbench {

std::shared_ptr<FakeQuantizeImpl> QuantizerFactory::operator()() const {
  return make_fake_quantize(fake_quantize, make_observer(observer, observer_options),
                            fake_quantize_params);
}

namespace {

ObserverOptions with_extra(const QuantizeScheme& scheme, const std::map<std::string, double>& extra) {
  // On a copy: MQBench merged these into the shared ParamsTable scheme (docs/compatibility.md).
  QuantizeScheme s = scheme;
  for (const auto& kv : extra) s.kwargs[kv.first] = kv.second;
  return s.to_observer_params();
}

std::string pick(const c10::optional<std::string>& user, const std::string& fallback,
                 const std::string& backend, const char* key) {
  if (user && !user->empty()) return *user;
  TORCH_CHECK(!fallback.empty(), "backend '", backend, "' has no default ", key,
              "; set it in ExtraQConfig");
  return fallback;
}

// The fake quantizer that runs the scheme's format (prepare_by_platform's FORMAT_FAKEQUANTIZE):
// MQBench's class itself for integer schemes, else its format twin; MX and NVFP4 have no
// learnable scale, so both of MQBench's classes map to their one module.
std::string format_twin(const std::string& name, const QuantizeScheme& s, const char* key) {
  if (!s.is_float()) return name;
  const bool fp8 = s.dtype == "fp8_e4m3" || s.dtype == "fp8_e5m2";
  const std::string fixed = fp8 ? "FP8FakeQuantize"
                                : s.dtype == "nvfp4" ? "NVFP4FakeQuantize" : "MXFakeQuantize";
  const std::string learnable = fp8 ? "LearnableFP8FakeQuantize" : fixed;
  if (name == fixed || name == learnable) return name;
  if (name == "FixedFakeQuantize") return fixed;
  if (name == "LearnableFakeQuantize") return learnable;
  TORCH_CHECK(false, key, ": ", name, " has no variant for dtype '", s.dtype, "'; use ",
              fixed == learnable ? fixed : fixed + " or " + learnable,
              " (or FixedFakeQuantize / LearnableFakeQuantize, which map to it)");
}

}  // namespace

QConfig get_qconfig(const std::string& backend, const ExtraQConfig& extra) {
  const BackendSpec spec = get_backend(backend);
  QConfig q;
  q.weight.observer = pick(extra.w_observer, spec.weight_observer, backend, "w_observer");
  q.activation.observer = pick(extra.a_observer, spec.activation_observer, backend, "a_observer");
  if (spec.qtype == "nnie") {  // NNIE must use NNIEFakeQuantize; only observers can change
    q.weight.fake_quantize = q.activation.fake_quantize = "NNIEFakeQuantize";
    q.weight.observer_options = spec.weight_scheme->to_observer_params();
    q.activation.observer_options = spec.activation_scheme->to_observer_params();
    return q;
  }
  QuantizeScheme w, a;
  if (spec.requires_user_qscheme()) {
    TORCH_CHECK(extra.w_qscheme && extra.a_qscheme, "backend '", backend,
                "' needs w_qscheme and a_qscheme in ExtraQConfig");
    w = *extra.w_qscheme;
    a = *extra.a_qscheme;
  } else {
    w = extra.w_qscheme ? *extra.w_qscheme : *spec.weight_scheme;
    a = extra.a_qscheme ? *extra.a_qscheme : *spec.activation_scheme;
  }
  w.validate();
  a.validate();
  // Group-wise schemes need the group observers, which are Python's only.
  TORCH_CHECK(w.group_size == 0, "w_qscheme: group_size ", w.group_size, " (docs/formats.md) has "
              "no C++ fake quantizer yet (its observers are Python's); prepare such a model "
              "with Python's prepare_by_platform, whose group quantizers call the same C++ ops");
  TORCH_CHECK(a.group_size == 0, "a_qscheme: group_size (", a.group_size,
              ") is for weights (group-wise weight-only formats); activations take a scale per "
              "tensor");
  q.weight.fake_quantize = format_twin(
      pick(extra.w_fakequantize, spec.weight_fake_quantize, backend, "w_fakequantize"), w,
      "w_fakequantize");
  q.activation.fake_quantize = format_twin(
      pick(extra.a_fakequantize, spec.activation_fake_quantize, backend, "a_fakequantize"), a,
      "a_fakequantize");
  q.weight.observer_options = with_extra(w, extra.w_observer_extra_args);
  q.activation.observer_options = with_extra(a, extra.a_observer_extra_args);
  q.weight.fake_quantize_params = extra.w_fakeq_params;
  q.activation.fake_quantize_params = extra.a_fakeq_params;
  return q;
}

}  // namespace mqbench
