// The translator registry and the atomic writer behind deploy() / deploy_file().

#include "mqbench/deploy/translator.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "mqbench/backend.h"
#include "mqbench/deploy/canonicalize.h"
#include "mqbench/deploy/check_model.h"
#include "mqbench/deploy/pass.h"

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

void check_file_name(const std::string& name, const char* what) {
  // One path component, so nothing lands outside the output folder.
  const bool ok = !name.empty() && name != "." && name != ".." && name.size() <= 200 &&
                  name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
  if (!ok) {
    std::string shown;
    for (char c : name) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
    throw DeployError(std::string("deploy: bad ") + what + " '" + shown +
                      "': it must be one file name (1-200 characters, no '/', no NUL byte, "
                      "not '.' or '..')");
  }
}

DeployOutput run_translator(const std::string& name, OnnxGraph fakeq, const DeployOptions& options,
                            std::vector<PassRecord>* passes) {
  check_file_name(options.model_name, "model_name");
  fakeq.check_structure("input model");
  ModelCheckOptions check;
  check.mqbench_forms = true;
  check_model(fakeq, "input model", check);
  const Translator& translator = get_translator(name);
  PassTrace trace;  // every pass the translator calls records itself (mqbench/deploy/pass.h)
  canonicalize_ops(fakeq);
  auto out = translator(std::move(fakeq), options);
  if (passes) *passes = trace.records();
  return out;
}

DeployOutput translate(OnnxGraph fakeq, const std::string& backend, const DeployOptions& options,
                       std::vector<PassRecord>* passes) {
  return run_translator(translator_of_backend(backend), std::move(fakeq), options, passes);
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

namespace {

// Writes `contents` to a new file `dir/.<name>.XXXXXX` created exclusively (mkstemp: O_CREAT |
// O_EXCL, mode 0600, a random name), so nobody can plant a file or a symlink at the temporary's
// name in advance; returns its path. rename() later replaces the final name itself, never the
// target of a symlink found there.
std::filesystem::path write_temporary(const std::filesystem::path& dir, const std::string& name,
                                      const std::string& contents) {
  std::string templ = (dir / ("." + name + ".XXXXXX")).string();
  const int fd = ::mkstemp(templ.data());
  if (fd < 0) {
    throw DeployError("cannot create a temporary file in '" + dir.string() + "': " +
                      std::strerror(errno));
  }
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(templ.c_str());
      throw DeployError("cannot write '" + templ + "': " + std::strerror(err));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  // Artifacts are for the user to read: the usual 0644 less the umask, not mkstemp's 0600.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0644 & ~mask) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(templ.c_str());
    throw DeployError("cannot write '" + templ + "': " + std::strerror(err));
  }
  return templ;
}

}  // namespace

namespace {

// An exclusive flock on the output folder for the commit of one set. flock locks belong to the
// open file description, so two threads of one process exclude each other as two processes do.
// Where the file system has no flock (some network mounts), the commit goes on unlocked.
class FolderLock {
 public:
  explicit FolderLock(const std::filesystem::path& dir)
      : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) throw DeployError("cannot open '" + dir.string() + "': " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      if (errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL || errno == EBADF) break;
      const int err = errno;
      ::close(fd_);
      throw DeployError("cannot lock '" + dir.string() + "': " + std::strerror(err));
    }
  }
  ~FolderLock() { ::close(fd_); }  // closing the last descriptor releases the lock
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
};

// A hard link to `file` under a fresh random name in `dir` (the old artifact, kept until the new
// set is in). mkstemp picks a name nobody holds; it is removed and linked at once (link never
// overwrites, so a name taken in between only makes this fail). Where a link is refused (a file
// of another user under fs.protected_hardlinks), the old file is moved aside instead: its name
// is then empty until the new file takes it.
std::filesystem::path keep_old(const std::filesystem::path& dir, const std::string& name,
                               const std::filesystem::path& file) {
  std::string templ = (dir / ("." + name + ".old.XXXXXX")).string();
  const int fd = ::mkstemp(templ.data());
  if (fd < 0) {
    throw DeployError("cannot create a temporary file in '" + dir.string() + "': " +
                      std::strerror(errno));
  }
  ::close(fd);
  ::unlink(templ.c_str());
  if (::link(file.c_str(), templ.c_str()) != 0 && ::rename(file.c_str(), templ.c_str()) != 0) {
    throw DeployError("cannot keep the old '" + file.string() +
                      "' while writing its replacement: " + std::strerror(errno));
  }
  return templ;
}

}  // namespace

std::vector<std::string> write_atomically(const std::string& dir, const std::vector<Artifact>& files) {
  namespace fs = std::filesystem;
  check_output_dir(dir);
  const fs::path base = dir.empty() ? fs::path(".") : fs::path(dir);
  std::set<std::string> names;
  for (const auto& f : files) {
    check_file_name(f.file_name, "output file name");
    if (!names.insert(f.file_name).second) {
      throw DeployError("deploy: two artifacts are named '" + f.file_name + "'");
    }
  }
  struct Staged {
    fs::path temp, final, old;  // old: a link to the file that was at `final`, if any
    bool placed = false;
  };
  std::vector<Staged> staged;
  // Removes what is left of the attempt, putting the old set back: a replaced name, or one whose
  // old file was moved aside (keep_old's fallback), gets its old file again.
  auto roll_back = [&] {
    std::error_code ec;
    for (auto& s : staged) {
      fs::remove(s.temp, ec);
      if (s.old.empty()) {
        if (s.placed) fs::remove(s.final, ec);
      } else if (s.placed || !fs::exists(fs::symlink_status(s.final, ec))) {
        fs::rename(s.old, s.final, ec);
      } else {
        fs::remove(s.old, ec);
      }
    }
  };
  try {
    for (const auto& f : files) {
      staged.push_back({write_temporary(base, f.file_name, f.contents), base / f.file_name, {}});
    }
    FolderLock lock(base);
    for (auto& s : staged) {
      struct stat st;
      if (::lstat(s.final.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
        s.old = keep_old(base, s.final.filename().string(), s.final);
      }
    }
    for (auto& s : staged) {
      std::error_code ec;
      fs::rename(s.temp, s.final, ec);
      if (ec) {
        throw DeployError("cannot move '" + s.temp.string() + "' to '" + s.final.string() +
                          "': " + ec.message());
      }
      s.placed = true;
    }
    std::vector<std::string> written;
    std::error_code ec;
    for (const auto& s : staged) {
      if (!s.old.empty()) fs::remove(s.old, ec);
      written.push_back(s.final.string());
    }
    return written;
  } catch (...) {
    roll_back();
    throw;
  }
}

namespace {
// The output directory is checked before the model is read (an unwritable path fails first).
// With an input file, no artifact may replace it (QDQ, ONNX_QNN and Academic write
// <name>.onnx, which with the CLI's default name and folder is the input itself).
template <typename Load>
std::vector<std::string> run(Load load, const std::string& backend, const DeployOptions& options,
                             std::vector<std::string>* notes, std::vector<PassRecord>* passes,
                             const std::string& input_path) {
  namespace fs = std::filesystem;
  check_output_dir(options.output_dir);
  auto out = translate(load(), backend, options, passes);
  const fs::path base = options.output_dir.empty() ? fs::path(".") : fs::path(options.output_dir);
  for (const auto& f : out.files) {
    std::error_code ec;
    if (!input_path.empty() && fs::equivalent(base / f.file_name, input_path, ec)) {
      throw DeployError("deploy: '" + (base / f.file_name).string() + "' would overwrite the "
                        "input model; choose another output folder or model name");
    }
  }
  if (notes) *notes = out.notes;
  return write_atomically(options.output_dir, out.files);
}
}  // namespace

std::vector<std::string> deploy(const std::string& onnx_bytes, const std::string& backend,
                                const DeployOptions& options, std::vector<std::string>* notes,
                                std::vector<PassRecord>* passes) {
  return run([&] { return OnnxGraph::parse(onnx_bytes); }, backend, options, notes, passes, "");
}

std::vector<std::string> deploy_file(const std::string& onnx_path, const std::string& backend,
                                     const DeployOptions& options, std::vector<std::string>* notes,
                                     std::vector<PassRecord>* passes) {
  return run([&] { return OnnxGraph::load(onnx_path); }, backend, options, notes, passes,
             onnx_path);
}

}  // namespace deploy
}  // namespace mqbench
