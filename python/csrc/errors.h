#pragma once
// Registry and quantizer errors (mqbench::Error, and c10::Error from tensor code) cross into
// Python as ValueError.

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include "mqbench/error.h"

namespace mqbench {
namespace python {

template <typename F>
auto as_value_error(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const mqbench::Error& e) {
    throw pybind11::value_error(e.what());
  } catch (const c10::Error& e) {
    throw pybind11::value_error(e.what_without_backtrace());
  }
}

}  // namespace python
}  // namespace mqbench
