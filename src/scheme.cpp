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

// The float formats (docs/formats.md): element width and largest finite element magnitude.
struct FloatFormat {
  const char* name;
  int64_t bits;
  int64_t max_finite;
};
// MXFP6 E2M3's largest element is 7.5: its observer range is the integer -7..7 (an MX
// observer's range informs only; each block's scale comes from its data).
constexpr FloatFormat kFloatFormats[] = {
    {"fp8_e4m3", 8, 448},  {"fp8_e5m2", 8, 57344}, {"mxfp8_e4m3", 8, 448},
    {"mxfp6_e3m2", 6, 28}, {"mxfp6_e2m3", 6, 7},   {"mxfp4", 4, 6},
    {"nvfp4", 4, 6},
};

const FloatFormat* float_format(const std::string& dtype) {
  for (const auto& f : kFloatFormats)
    if (dtype == f.name) return &f;
  return nullptr;
}

void check_dtype(const QuantizeScheme& s) {
  if (s.dtype == "int") {
    MQBENCH_CHECK(s.group_size >= 0, "QuantizeScheme: group_size must be a positive integer "
                  "(0: none), got ", s.group_size);
    MQBENCH_CHECK(s.group_size == 0 || s.per_channel,
                  "QuantizeScheme: group_size (", s.group_size, ") gives one scale per group "
                  "within each output channel; set per_channel=True");
    return;
  }
  const FloatFormat* f = float_format(s.dtype);
  MQBENCH_CHECK(f != nullptr, "QuantizeScheme: unknown dtype '", s.dtype,
                "'; valid: int, fp8_e4m3, fp8_e5m2, mxfp8_e4m3, mxfp6_e3m2, mxfp6_e2m3, mxfp4, "
                "nvfp4");
  MQBENCH_CHECK(s.bit == f->bits, "QuantizeScheme: bit (", s.bit, ") does not apply to dtype '",
                s.dtype, "', whose elements are ", f->bits, " bits wide; leave bit out (Python) "
                "or set it to ", f->bits);
  MQBENCH_CHECK(s.symmetry, "QuantizeScheme: dtype '", s.dtype, "' is symmetric (a scale, no "
                "zero point); symmetry=False is not a ", s.dtype, " scheme");
  MQBENCH_CHECK(s.group_size == 0, "QuantizeScheme: group_size (", s.group_size,
                ") is for integer formats; dtype '", s.dtype, "' has ",
                (s.dtype.rfind("fp8", 0) == 0 ? "a scale per tensor or per channel"
                                              : "its block size fixed by its spec"));
  MQBENCH_CHECK(!s.symmetric_range, "QuantizeScheme: symmetric_range is for integer formats; "
                "dtype '", s.dtype, "' is symmetric by construction");
  const bool block = s.dtype.rfind("fp8", 0) != 0;
  MQBENCH_CHECK(!block || !s.per_channel, "QuantizeScheme: per_channel does not apply to dtype '",
                s.dtype, "' (one scale per block of the input-channel axis, fixed by its spec)");
  MQBENCH_CHECK(!block || !s.pot_scale, "QuantizeScheme: pot_scale does not apply to dtype '",
                s.dtype, "' (its block scales are set by its spec)");
}

void check_bit(const QuantizeScheme& s) {
  check_dtype(s);
  if (s.is_float()) return;
  MQBENCH_CHECK(s.bit >= 1 && s.bit <= 24, "QuantizeScheme: bit must be an integer in [1, 24], got ",
                s.bit);
  MQBENCH_CHECK(!(s.symmetry && s.symmetric_range && s.bit < 2),
                "QuantizeScheme: bit=1 with symmetry and symmetric_range leaves the single level 0 "
                "([0, 0]); use bit >= 2 or symmetric_range=False ([-1, 0])");
}
}  // namespace

void QuantizeScheme::validate() const { check_bit(*this); }

int64_t QuantizeScheme::quant_min() const {
  check_bit(*this);
  if (is_float()) return -float_format(dtype)->max_finite;
  if (!symmetry) return 0;
  const int64_t half = int64_t(1) << (bit - 1);
  return symmetric_range ? -half + 1 : -half;
}

int64_t QuantizeScheme::quant_max() const {
  check_bit(*this);
  if (is_float()) return float_format(dtype)->max_finite;
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
  // Float formats: the range is +-(largest finite element, rounded down to an integer: MXFP6
  // E2M3's 7.5 is 7), so a symmetric observer's amax / ((quant_max - quant_min) / 2) is the
  // per-tensor formats' scale (the block formats compute theirs from the data); the format
  // says which op runs.
  o.format = dtype;
  if (is_float()) o.dtype = dtype;
  if (group_size > 0) {  // groups run along the input-channel axis of the weight
    o.ch_axis = 1;
    o.group_size = group_size;
  }
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
  if (dtype != "int") s << " / Dtype: " << dtype;
  if (group_size > 0) s << " / Group size: " << group_size;
  return s.str();
}

bool QuantizeScheme::operator==(const QuantizeScheme& o) const {
  return symmetry == o.symmetry && per_channel == o.per_channel && pot_scale == o.pot_scale &&
         bit == o.bit && symmetric_range == o.symmetric_range && kwargs == o.kwargs && dtype == o.dtype &&
         group_size == o.group_size;
}

}  // namespace mqbench
