// The translator registry and the atomic writer behind deploy() / deploy_file().

#include "mqbench/deploy/translator.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "mqbench/backend.h"

namespace mqbench {
namespace deploy {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, Translator> translators;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

}  // namespace

void register_translator(const std::string& name, Translator fn) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (name.empty()) throw DeployError("register_translator: the name is empty");
  if (!fn) throw DeployError("register_translator(" + name + "): the translator is empty");
  if (!r.translators.emplace(name, std::move(fn)).second) {
    throw DeployError("register_translator: a translator named '" + name + "' is already registered");
  }
}

std::vector<std::string> translator_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& kv : r.translators) names.push_back(kv.first);
  return names;
}

const Translator& get_translator(const std::string& name) {
  auto& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.translators.find(name);
    if (it != r.translators.end()) return it->second;
  }
  throw DeployError("unknown deploy translator '" + name + "'; registered translators: " +
                    join(translator_names()));
}

std::string translator_of_backend(const std::string& backend) {
  BackendSpec spec;
  try {
    spec = get_backend(backend);
  } catch (const DeployError&) {
    throw;
  } catch (const Error& e) {
    throw DeployError(e.what());
  }
  if (spec.deploy_translator.empty()) {
    throw DeployError("backend '" + backend + "' names no deploy translator (BackendSpec::deploy_translator)");
  }
  return spec.deploy_translator;
}

DeployOutput translate(OnnxGraph fakeq, const std::string& backend, const DeployOptions& options) {
  if (options.model_name.empty()) throw DeployError("deploy: model_name is empty");
  if (options.model_name.find('/') != std::string::npos) {
    throw DeployError("deploy: model_name '" + options.model_name + "' must not contain '/'");
  }
  return get_translator(translator_of_backend(backend))(std::move(fakeq), options);
}

void check_output_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string d = dir.empty() ? "." : dir;
  std::error_code ec;
  if (fs::exists(d, ec) && !fs::is_directory(d, ec)) {
    throw DeployError("output path '" + d + "' exists and is not a directory");
  }
  fs::create_directories(d, ec);
  if (ec) throw DeployError("cannot create output directory '" + d + "': " + ec.message());
  if (::access(d.c_str(), W_OK | X_OK) != 0) {
    throw DeployError("output directory '" + d + "' is not writable: " + std::strerror(errno));
  }
}

std::vector<std::string> write_atomically(const std::string& dir, const std::vector<Artifact>& files) {
  namespace fs = std::filesystem;
  check_output_dir(dir);
  const fs::path base = dir.empty() ? fs::path(".") : fs::path(dir);
  std::vector<std::pair<fs::path, fs::path>> staged;  // temp -> final
  auto discard = [&] {
    std::error_code ec;
    for (const auto& s : staged) fs::remove(s.first, ec);
  };
  for (const auto& f : files) {
    if (f.file_name.empty() || f.file_name.find('/') != std::string::npos) {
      discard();
      throw DeployError("deploy: bad output file name '" + f.file_name + "'");
    }
    const fs::path final_path = base / f.file_name;
    const fs::path tmp = base / ("." + f.file_name + ".tmp" + std::to_string(::getpid()));
    staged.emplace_back(tmp, final_path);
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(f.contents.data(), static_cast<std::streamsize>(f.contents.size()));
    out.close();
    if (!out) {
      discard();
      throw DeployError("cannot write '" + tmp.string() + "' (disk full or not writable?)");
    }
  }
  std::vector<std::string> written;
  for (const auto& s : staged) {
    std::error_code ec;
    fs::rename(s.first, s.second, ec);
    if (ec) {
      discard();
      throw DeployError("cannot move '" + s.first.string() + "' to '" + s.second.string() + "': " + ec.message());
    }
    written.push_back(s.second.string());
  }
  return written;
}

namespace {
// The output directory is checked before the model is read (an unwritable path fails first).
template <typename Load>
std::vector<std::string> run(Load load, const std::string& backend, const DeployOptions& options,
                             std::vector<std::string>* notes) {
  check_output_dir(options.output_dir);
  auto out = translate(load(), backend, options);
  if (notes) *notes = out.notes;
  return write_atomically(options.output_dir, out.files);
}
}  // namespace

std::vector<std::string> deploy(const std::string& onnx_bytes, const std::string& backend,
                                const DeployOptions& options, std::vector<std::string>* notes) {
  return run([&] { return OnnxGraph::parse(onnx_bytes); }, backend, options, notes);
}

std::vector<std::string> deploy_file(const std::string& onnx_path, const std::string& backend,
                                     const DeployOptions& options, std::vector<std::string>* notes) {
  return run([&] { return OnnxGraph::load(onnx_path); }, backend, options, notes);
}

}  // namespace deploy
}  // namespace mqbench
