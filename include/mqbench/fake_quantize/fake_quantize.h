#pragma once
// C++ twins of MQBench's fake quantizers (mqbench.fake_quantize): torch::nn::Module classes with
// the same parameter and buffer names (scale, zero_point, fake_quant_enabled, observer_enabled,
// eps, activation_post_process.*) whose forward observes (when observer_enabled) and then calls
// one fake-quantize op (when fake_quant_enabled), as the Python classes do.
//
// Example:
//   auto qconfig = mqbench::get_qconfig("Tensorrt");          // include/mqbench/qconfig.h
//   auto act = qconfig.activation();                            // LearnableFakeQuantize
//   act->forward(calibration_batch);                            // observes, initialises scale
//   act->disable_observer();
//   auto y = act->forward(x);  y.sum().backward();              // act->scale.grad() is set

#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mqbench/observer/observer.h"

namespace mqbench {

class FakeQuantizeImpl : public torch::nn::Module {
 public:
  FakeQuantizeImpl(std::shared_ptr<ObserverImpl> observer, const std::string& name);

  virtual torch::Tensor forward(const torch::Tensor& x) = 0;

  void enable_fake_quant(bool enabled = true);
  void disable_fake_quant() { enable_fake_quant(false); }
  void enable_observer(bool enabled = true);
  void disable_observer() { enable_observer(false); }
  bool fake_quant_on() const;
  bool observer_on() const;
  std::tuple<torch::Tensor, torch::Tensor> calculate_qparams();

  std::shared_ptr<ObserverImpl> activation_post_process;
  torch::Tensor fake_quant_enabled, observer_enabled;
  int64_t quant_min, quant_max, ch_axis, bitwidth;
  bool is_per_channel, is_symmetric_quant, pot_scale;

 protected:
  /// Observes x and replaces `scale`/`zero_point` (buffers or Parameters) with its qparams.
  void observe_into_buffers(const torch::Tensor& x, torch::Tensor& scale, torch::Tensor& zp);
  /// LSQ-style: observe and copy into the scale/zero_point parameters, or keep scale >= eps.
  void observe_into_parameters(const torch::Tensor& x, torch::Tensor& scale, torch::Tensor& zp,
                               const torch::Tensor& eps);
  torch::Tensor fixed(const torch::Tensor& x, const torch::Tensor& scale,
                      const torch::Tensor& zp) const;
};

/// Builds a fake quantizer by MQBench name (FixedFakeQuantize, LearnableFakeQuantize,
/// NNIEFakeQuantize, DoReFaFakeQuantize, DSQFakeQuantize, PACTFakeQuantize, TqtFakeQuantize,
/// AdaRoundFakeQuantize, QDropFakeQuantize) or format twin (FP8FakeQuantize,
/// LearnableFP8FakeQuantize, MXFakeQuantize, NVFP4FakeQuantize: docs/formats.md; the
/// observer's format names the element format) around `observer`. `params` are the fake
/// quantizer's own arguments (alpha for DSQ and PACT, use_grad_scaling for Learnable, scale
/// and zero_point initial values, block_size and axis for MX / NVFP4, axis -2 meaning the
/// input channels). Unknown names or parameters raise, listing the valid ones.
std::shared_ptr<FakeQuantizeImpl> make_fake_quantize(const std::string& name,
                                                     std::shared_ptr<ObserverImpl> observer,
                                                     const std::map<std::string, double>& params = {});

/// The names make_fake_quantize accepts.
std::vector<std::string> cpp_fake_quantize_names();

/// TqtFakeQuantize's set_quant_type ('input', 'tensor' or 'param'); raises for other kinds.
void set_quant_type(FakeQuantizeImpl& fq, const std::string& quant_type);

/// AdaRoundFakeQuantize's init(weight): switches to learned rounding (see the Python class).
void adaround_init(FakeQuantizeImpl& fq, const torch::Tensor& weight);

/// QDropFakeQuantize's drop probability.
void set_qdrop_prob(FakeQuantizeImpl& fq, double prob);

}  // namespace mqbench
