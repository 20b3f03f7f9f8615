#pragma once
// The library version string (libmqbench_deploy; the CMake project version).

namespace mqbench {

/// The library version, e.g. "0.1.0".
const char* version();

}  // namespace mqbench
