#pragma once
// C++ twins of MQBench's observers (mqbench.observer): torch::nn::Module classes with the same
// buffer names (eps, min_val, max_val) and the same ops as the Python classes, for C++
// applications. Formulas: docs/observers.md.
//
// Example:
//   mqbench::ObserverOptions opts = mqbench::QuantizeScheme{true, true, false, 8, true}
//                                       .to_observer_params();
//   auto obs = mqbench::make_observer("MinMaxObserver", opts);
//   obs->forward(weight);
//   auto [scale, zero_point] = obs->calculate_qparams();   // [C] each

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "mqbench/scheme.h"

namespace mqbench {

class ObserverImpl : public torch::nn::Module {
 public:
  explicit ObserverImpl(ObserverOptions options, const std::string& name = "Observer");

  /// Observes x (any float tensor; empty tensors are ignored) and returns it as the observer's
  /// dtype: update(batch_range(x)).
  virtual torch::Tensor forward(const torch::Tensor& x);
  /// Scale (x's dtype) and zero point of the observed range; scale 1, zero point 0 before data.
  virtual std::tuple<torch::Tensor, torch::Tensor> calculate_qparams();

  const ObserverOptions& options() const { return options_; }
  int64_t quant_min() const { return quant_min_; }
  int64_t quant_max() const { return quant_max_; }
  int64_t ch_axis() const { return options_.ch_axis; }
  bool symmetric() const { return options_.symmetric(); }
  /// MQBench's quant_type ('input', 'tensor', 'param'); only the power-of-two observers use it.
  virtual void set_quant_type(const std::string& quant_type) { quant_type_ = quant_type; }

  torch::Tensor eps, min_val, max_val;

 protected:
  torch::Tensor prepare(const torch::Tensor& x) const;
  std::tuple<torch::Tensor, torch::Tensor> range_qparams(const torch::Tensor& mn,
                                                         const torch::Tensor& mx) const;
  std::tuple<torch::Tensor, torch::Tensor> finish(torch::Tensor scale, torch::Tensor zp) const;
  void set_range(const std::tuple<torch::Tensor, torch::Tensor>& range);
  /// One batch's (min, max); subclasses clip or search it.
  virtual std::tuple<torch::Tensor, torch::Tensor> batch_range(const torch::Tensor& x);
  /// Combines a batch's range with the state: running min/max (MinMaxObserver's rule).
  virtual void update(const std::tuple<torch::Tensor, torch::Tensor>& cur);
  /// The EMA observers' rule: the first batch as is, then v = v * r + batch * (1 - r).
  void ema_update(const std::tuple<torch::Tensor, torch::Tensor>& cur);
  int64_t symmetric_zero_point() const;
  double option(const char* key, double fallback) const;

  ObserverOptions options_;
  int64_t quant_min_, quant_max_;
  std::string quant_type_;
};

/// Builds an observer by MQBench name (MinMaxObserver, EMAMinMaxObserver, MinMaxFloorObserver,
/// PoTModeObserver, EMAQuantileObserver, ClipStdObserver, LSQObserver, LSQPlusObserver,
/// MSEObserver, EMAMSEObserver). Observer-specific arguments come from options.extra
/// (ema_ratio, threshold, bins, std_scale, p). Unknown names raise, listing the valid ones.
std::shared_ptr<ObserverImpl> make_observer(const std::string& name,
                                            const ObserverOptions& options);

/// The names make_observer accepts.
std::vector<std::string> cpp_observer_names();

}  // namespace mqbench
