// The library version, compiled in from the CMake project version (MQBENCH_VERSION_STRING).

#include "mqbench/version.h"

namespace mqbench {

const char* version() { return MQBENCH_VERSION_STRING; }

}  // namespace mqbench
