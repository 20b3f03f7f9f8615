#pragma once
// get_qconfig: the C++ counterpart of MQBench's get_qconfig_by_platform. A QConfig holds two
// factories (weight and activation); each builds a fresh fake quantizer with its observer.
//
// Example:
//   mqbench::ExtraQConfig extra;
//   extra.a_observer = "MSEObserver";
//   auto qconfig = mqbench::get_qconfig("Tensorrt", extra);
//   auto w_fq = qconfig.weight();                 // LearnableFakeQuantize, [-127, 127], ch_axis 0

#include <c10/util/Optional.h>

#include <map>
#include <memory>
#include <string>

#include "mqbench/fake_quantize/fake_quantize.h"
#include "mqbench/scheme.h"

namespace mqbench {

struct QuantizerFactory {
  std::string fake_quantize;                  // registry name
  std::string observer;                       // registry name
  ObserverOptions observer_options;
  std::map<std::string, double> fake_quantize_params;

  std::shared_ptr<FakeQuantizeImpl> operator()() const;
};

struct QConfig {
  QuantizerFactory activation, weight;
};

/// MQBench's extra_qconfig_dict.
struct ExtraQConfig {
  c10::optional<std::string> w_observer, a_observer, w_fakequantize, a_fakequantize;
  std::map<std::string, double> w_fakeq_params, a_fakeq_params;
  c10::optional<QuantizeScheme> w_qscheme, a_qscheme;  // required for Academic backends
  std::map<std::string, double> w_observer_extra_args, a_observer_extra_args;
};

/// The weight and activation quantizer factories of a registered backend, with the rules of
/// get_qconfig_by_platform (NNIE: only observers can change; Academic: schemes required).
QConfig get_qconfig(const std::string& backend, const ExtraQConfig& extra = {});

}  // namespace mqbench
