#pragma once
// The error type of the torch-free part of the library (the backend registry, schemes and the
// deploy passes; docs/design/build-and-ci.md). Tensor code keeps TORCH_CHECK / c10::Error.
//
//   MQBENCH_CHECK(bit >= 1, "QuantizeScheme: bit must be >= 1, got ", bit);  // throws Error

#include <sstream>
#include <stdexcept>
#include <string>

namespace mqbench {

/// Bad arguments to the registry or the schemes (Python: ValueError).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace deploy {
/// The one exception type of the deploy library (bad ONNX input, unsupported graph, I/O).
class DeployError : public Error {
 public:
  using Error::Error;
};
}  // namespace deploy

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}
}  // namespace detail

}  // namespace mqbench

/// Throws mqbench::Error with the arguments streamed into its message when `cond` is false.
#define MQBENCH_CHECK(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond)) throw ::mqbench::Error(::mqbench::detail::str_cat(__VA_ARGS__)); \
  } while (false)
