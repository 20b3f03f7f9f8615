#pragma once
// Note [CPU capability dispatch]
// Kernels written with at::vec::Vectorized live in files listed in MQBENCH_VEC_KERNEL_SOURCES
// (CMakeLists.txt). CMake compiles each of them twice: once for the baseline x86-64 ISA
// ("default") and once with -mavx2 -mfma -mf16c ("avx2"); MQBENCH_CPU_CAPABILITY names the copy
// being compiled. Each copy registers its function pointers into a Stub; calls go through
// Stub::get(), which picks the best copy the running CPU supports. The environment variable
// MQBENCH_CPU_CAPABILITY=default forces the baseline copy (the test suite runs both).

#include <c10/util/Exception.h>

namespace mqbench {
namespace cpu {

enum class Capability { kDefault = 0, kAvx2 = 1 };

/// The capability used for dispatch (detected once; MQBENCH_CPU_CAPABILITY overrides it).
Capability active_capability();
const char* capability_name(Capability c);

template <typename FnPtr>
struct Stub {
  FnPtr fns[2] = {nullptr, nullptr};

  FnPtr get() const {
    const auto c = static_cast<int>(active_capability());
    for (int i = c; i >= 0; --i) {
      if (fns[i] != nullptr) return fns[i];
    }
    TORCH_CHECK(false, "mqbench: no CPU kernel registered for this operation");
  }
};

template <typename FnPtr>
struct StubRegisterer {
  StubRegisterer(Stub<FnPtr>& stub, Capability c, FnPtr fn) {
    stub.fns[static_cast<int>(c)] = fn;
  }
};

}  // namespace cpu
}  // namespace mqbench

#define MQBENCH_DECLARE_STUB(name, fn_type) extern ::mqbench::cpu::Stub<fn_type> name
#define MQBENCH_DEFINE_STUB(name, fn_type) ::mqbench::cpu::Stub<fn_type> name

#define MQBENCH_CAP_CONCAT_(a, b) a##b
#define MQBENCH_CAP_CONCAT(a, b) MQBENCH_CAP_CONCAT_(a, b)
#define MQBENCH_CAP_cap_default ::mqbench::cpu::Capability::kDefault
#define MQBENCH_CAP_cap_avx2 ::mqbench::cpu::Capability::kAvx2

// Used inside the per-capability kernel files.
#define MQBENCH_REGISTER_STUB(stub, fn)                                                    \
  static ::mqbench::cpu::StubRegisterer<decltype(&fn)> MQBENCH_CAP_CONCAT(                \
      stub##_registerer_, __LINE__)(stub, MQBENCH_CAP_CONCAT(MQBENCH_CAP_, MQBENCH_CPU_CAPABILITY), &fn)
