// The deploy pass registry and the trace of the passes a deploy ran (mqbench/deploy/pass.h).

#include "mqbench/deploy/pass.h"

#include <exception>
#include <map>
#include <mutex>

namespace mqbench {
namespace deploy {
namespace {

struct Entry {
  std::string description;
  PassFunction fn;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> passes;
};

Registry& registry() {
  static Registry r;
  return r;
}

thread_local std::vector<PassRecord>* current_trace = nullptr;

const Entry& entry(const std::string& name) {
  auto& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.passes.find(name);
    if (it != r.passes.end()) return it->second;
  }
  std::string names;
  for (const auto& n : pass_names()) names += (names.empty() ? "" : ", ") + n;
  throw DeployError("unknown deploy pass '" + name + "'; registered passes: " + names);
}

}  // namespace

void register_pass(const std::string& name, const std::string& description, PassFunction fn) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (name.empty()) throw DeployError("register_pass: the name is empty");
  if (!fn) throw DeployError("register_pass(" + name + "): the pass is empty");
  if (!r.passes.emplace(name, Entry{description, std::move(fn)}).second) {
    throw DeployError("register_pass: a pass named '" + name + "' is already registered");
  }
}

std::vector<std::string> pass_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& kv : r.passes) names.push_back(kv.first);
  return names;
}

const std::string& pass_description(const std::string& name) { return entry(name).description; }

PassResult run_pass(const std::string& name, OnnxGraph& g) {
  const auto& e = entry(name);
  // The passes read each node's inputs and outputs; a graph from a file may lack them.
  g.check_structure("the model given to pass '" + name + "'");
  return e.fn(g);
}

PassTrace::PassTrace() : previous_(current_trace) { current_trace = &records_; }
PassTrace::~PassTrace() { current_trace = previous_; }

PassScope::PassScope(const char* name, const OnnxGraph& g)
    : name_(name),
      g_(g),
      nodes_before_(g.graph().node_size()),
      uncaught_(std::uncaught_exceptions()),
      start_(std::chrono::steady_clock::now()) {}

PassScope::~PassScope() {
  if (current_trace == nullptr || std::uncaught_exceptions() > uncaught_) return;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  try {
    current_trace->push_back({name_, nodes_before_, g_.graph().node_size(), ms});
  } catch (...) {  // a trace that cannot grow loses the record, not the deploy
  }
}

}  // namespace deploy
}  // namespace mqbench
