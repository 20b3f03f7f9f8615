#pragma once
// QuantizeScheme: the quantization scheme of weights or activations (MQBench's
// mqbench.scheme.QuantizeScheme), and the observer options it produces.
//
// Example:
//   mqbench::QuantizeScheme w{/*symmetry=*/true, /*per_channel=*/true, /*pot_scale=*/false,
//                             /*bit=*/8, /*symmetric_range=*/true};
//   auto opts = w.to_observer_params();   // quant_min -127, quant_max 127, ch_axis 0, qint8

#include <optional>

#include <cstdint>
#include <map>
#include <string>

namespace mqbench {

/// Options every observer takes (MQBench's ObserverBase arguments) plus the observer-specific
/// ones in `extra` (ema_ratio, threshold, bins, std_scale, p).
struct ObserverOptions {
  std::string dtype = "quint8";                 // "qint8" or "quint8"
  std::string qscheme = "per_tensor_affine";    // torch's qscheme names
  bool reduce_range = false;
  std::optional<int64_t> quant_min, quant_max;  // both or neither
  int64_t ch_axis = -1;                         // -1: per tensor
  bool pot_scale = false;
  std::map<std::string, double> extra;

  bool symmetric() const;
  bool per_channel() const;
  /// The effective range: the custom one, or the dtype's default (torch's rule).
  std::pair<int64_t, int64_t> range() const;
};

struct QuantizeScheme {
  bool symmetry = true;
  bool per_channel = false;
  bool pot_scale = false;
  int64_t bit = 8;
  /// Symmetric range [-(2^(b-1) - 1), 2^(b-1) - 1] instead of [-2^(b-1), 2^(b-1) - 1].
  bool symmetric_range = false;
  /// Extra keyword arguments merged into the observer options (MQBench's kwargs).
  std::map<std::string, double> kwargs;

  int64_t quant_min() const;
  int64_t quant_max() const;
  /// "per_channel_symmetric", "per_tensor_affine", ...
  std::string torch_qscheme() const;
  /// MQBench's to_observer_params(): range, dtype, pot_scale, qscheme, reduce_range=false,
  /// ch_axis (0 per channel, else -1), then the kwargs.
  ObserverOptions to_observer_params() const;
  /// MQBench's __str__.
  std::string str() const;

  bool operator==(const QuantizeScheme& o) const;
};

}  // namespace mqbench
