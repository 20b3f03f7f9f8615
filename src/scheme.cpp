// QuantizeScheme and ObserverOptions (include/mqbench/scheme.h): integer ranges, the torch
// qscheme name, the observer arguments a scheme turns into, and their checks.

#include "mqbench/scheme.h"

#include "mqbench/error.h"

#include <sstream>

namespace mqbench {

bool ObserverOptions::symmetric() const {
  return qscheme == "per_tensor_symmetric" || qscheme == "per_channel_symmetric";
}

bool ObserverOptions::per_channel() const { return qscheme.rfind("per_channel", 0) == 0; }

std::pair<int64_t, int64_t> ObserverOptions::range() const {
  if (quant_min && quant_max) return {*quant_min, *quant_max};
  if (dtype == "qint8") return reduce_range ? std::make_pair<int64_t, int64_t>(-64, 63)
                                            : std::make_pair<int64_t, int64_t>(-128, 127);
  if (dtype == "quint8") return reduce_range ? std::make_pair<int64_t, int64_t>(0, 127)
                                             : std::make_pair<int64_t, int64_t>(0, 255);
  return {0, 15};
}

namespace {
void check_bit(const QuantizeScheme& s) {
  MQBENCH_CHECK(s.bit >= 1 && s.bit <= 24, "QuantizeScheme: bit must be an integer in [1, 24], got ",
                s.bit);
  MQBENCH_CHECK(!(s.symmetry && s.symmetric_range && s.bit < 2),
                "QuantizeScheme: bit=1 with symmetry and symmetric_range leaves the single level 0 "
                "([0, 0]); use bit >= 2 or symmetric_range=False ([-1, 0])");
}
}  // namespace

int64_t QuantizeScheme::quant_min() const {
  check_bit(*this);
  if (!symmetry) return 0;
  const int64_t half = int64_t(1) << (bit - 1);
  return symmetric_range ? -half + 1 : -half;
}

int64_t QuantizeScheme::quant_max() const {
  check_bit(*this);
  return symmetry ? (int64_t(1) << (bit - 1)) - 1 : (int64_t(1) << bit) - 1;
}

std::string QuantizeScheme::torch_qscheme() const {
  return std::string(per_channel ? "per_channel_" : "per_tensor_") +
         (symmetry ? "symmetric" : "affine");
}

ObserverOptions QuantizeScheme::to_observer_params() const {
  ObserverOptions o;
  o.quant_min = quant_min();
  o.quant_max = quant_max();
  o.dtype = symmetry ? "qint8" : "quint8";
  o.pot_scale = pot_scale;
  o.qscheme = torch_qscheme();
  o.reduce_range = false;
  o.ch_axis = per_channel ? 0 : -1;
  o.extra = kwargs;
  return o;
}

std::string QuantizeScheme::str() const {
  auto b = [](bool v) { return v ? "True" : "False"; };
  std::ostringstream s;
  s << "Symmetric: " << b(symmetry) << " / Bitwidth: " << bit << " / Per channel: "
    << b(per_channel) << " / Pot scale: " << b(pot_scale) << " / Extra kwargs: {";
  bool first = true;
  for (const auto& kv : kwargs) {
    s << (first ? "" : ", ") << "'" << kv.first << "': " << kv.second;
    first = false;
  }
  s << "}";
  return s.str();
}

bool QuantizeScheme::operator==(const QuantizeScheme& o) const {
  return symmetry == o.symmetry && per_channel == o.per_channel && pot_scale == o.pot_scale &&
         bit == o.bit && symmetric_range == o.symmetric_range && kwargs == o.kwargs;
}

}  // namespace mqbench
