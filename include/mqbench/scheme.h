#pragma once
// QuantizeScheme: the quantization scheme of weights or activations (MQBench's
// mqbench.scheme.QuantizeScheme), and the observer options it produces.
//
// Example:
//   mqbench::QuantizeScheme w{/*symmetry=*/true, /*per_channel=*/true, /*pot_scale=*/false,
//                             /*bit=*/8, /*symmetric_range=*/true};
//   auto opts = w.to_observer_params();   // quant_min -127, quant_max 127, ch_axis 0, qint8
//   mqbench::QuantizeScheme g = w; g.bit = 4; g.group_size = 128;   // INT4, 128 per group
//   mqbench::QuantizeScheme f; f.dtype = "fp8_e4m3";                  // FP8 E4M3, per tensor

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
  int64_t ch_axis = -1;                         // -1: per tensor; the grouped axis with group_size
  bool pot_scale = false;
  /// The element format (QuantizeScheme::dtype): "int", "fp8_e4m3", ... (docs/formats.md).
  std::string format = "int";
  /// One scale per `group_size` consecutive elements along `ch_axis`; 0: none.
  int64_t group_size = 0;
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
  /// The element format (docs/formats.md): "int" (MQBench's integers, `bit` wide), "fp8_e4m3",
  /// "fp8_e5m2", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4". A float format is
  /// symmetric, fixes `bit` to its element width (8, 6 or 4) and takes no symmetric_range nor
  /// group_size.
  std::string dtype = "int";
  /// Integer formats: one scale (and zero point) per `group_size` consecutive elements along
  /// the input-channel axis (axis 1 of a weight), within each output channel; 0: none.
  /// Needs per_channel; the axis length must be a multiple (checked where the axis is known).
  int64_t group_size = 0;

  int64_t quant_min() const;
  int64_t quant_max() const;
  /// "per_channel_symmetric", "per_tensor_affine", ...
  std::string torch_qscheme() const;
  /// MQBench's to_observer_params(): range, dtype, pot_scale, qscheme, reduce_range=false,
  /// ch_axis (0 per channel, else -1), then the kwargs.
  ObserverOptions to_observer_params() const;
  /// Throws mqbench::Error naming the field of an invalid combination (bit with a float dtype,
  /// asymmetric float formats, group_size with a float dtype or without per_channel, ...).
  void validate() const;
  bool is_float() const { return dtype != "int"; }
  /// MQBench's __str__ (with " / Dtype: ..." and " / Group size: ..." when they are set).
  std::string str() const;

  bool operator==(const QuantizeScheme& o) const;
};

}  // namespace mqbench
