#pragma once
// Writing a deploy translator: the Translator type, its registry and the ONNX graph it edits.
// Include this only in code built against mqbench::deploy without torch's include folders
// (torch's wheels ship protobuf headers that would shadow the ones the ONNX classes were
// generated with; docs/design/build-and-ci.md).
//
//   MQBENCH_REGISTER_DEPLOY_TRANSLATOR(my_chip, "my_chip",
//       [](mqbench::deploy::OnnxGraph g, const mqbench::deploy::DeployOptions& o) {
//         mqbench::deploy::DeployOutput out;
//         ...  // remove_fake_quant(g), write the vendor's files into out.files
//         return out;
//       });

#include <functional>
#include <string>
#include <vector>

#include "mqbench/deploy/deploy.h"
#include "mqbench/deploy/fake_quant.h"
#include "mqbench/deploy/onnx_graph.h"
#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {

/// A translator turns the fake-quantized model into files; it must not write anything itself.
/// It owns the model it is given (edit it in place; copy it only when two versions are needed).
using Translator = std::function<DeployOutput(OnnxGraph fakeq, const DeployOptions&)>;

void register_translator(const std::string& name, Translator fn);
/// The translator `name`; raises DeployError listing the registered names when there is none.
const Translator& get_translator(const std::string& name);
/// Runs translator `name` on the model without writing: checks the model's structure
/// (OnnxGraph::check_structure), brings the ops torch's two exporters write differently to one
/// form (canonicalize_ops, mqbench/deploy/canonicalize.h), then calls the translator; `passes`
/// (when given) receives the passes run, in order (mqbench/deploy/pass.h). Every deploy entry
/// point (translate, deploy, the Python binding, the CLI) goes through here.
DeployOutput run_translator(const std::string& name, OnnxGraph fakeq, const DeployOptions& options,
                            std::vector<PassRecord>* passes = nullptr);
/// Runs `backend`'s translator on the model without writing (run_translator).
DeployOutput translate(OnnxGraph fakeq, const std::string& backend, const DeployOptions& options,
                       std::vector<PassRecord>* passes = nullptr);

namespace detail {
struct TranslatorRegisterer {
  TranslatorRegisterer(const std::string& name, Translator fn) { register_translator(name, std::move(fn)); }
};
}  // namespace detail

}  // namespace deploy
}  // namespace mqbench

/// Registers translator `name` at load time; `id` names the static registrar; the rest is the
/// Translator (a function or a lambda).
#define MQBENCH_REGISTER_DEPLOY_TRANSLATOR(id, name, ...) \
  static ::mqbench::deploy::detail::TranslatorRegisterer mqbench_translator_registerer_##id(name, __VA_ARGS__)
