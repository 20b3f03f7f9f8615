#pragma once
// Typed handles to the mqbench ops in torch's dispatcher, for the C++ entry points and the
// autograd functions (which call an op below autograd, or its backward op).

#include <ATen/core/dispatch/Dispatcher.h>

namespace mqbench {
namespace ops {
namespace detail {

/// Typed dispatcher handle of the op "mqbench::<name>" (looked up once per call site when kept
/// in a function-local static).
template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
