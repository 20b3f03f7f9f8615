#include "mqbench/version.h"

namespace mqbench {

const char* version() { return MQBENCH_VERSION_STRING; }

}  // namespace mqbench
