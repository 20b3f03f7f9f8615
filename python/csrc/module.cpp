// mqbench._C: pybind11 glue only (design rule 6). Tensor ops are not bound here: they are
// registered with torch's dispatcher when this module loads libmqbench, and are called as
// torch.ops.mqbench.<op>.

#include <pybind11/pybind11.h>

#include "mqbench/version.h"

namespace mqbench {
namespace python {
void bind_ops(pybind11::module_& m);
void bind_backends(pybind11::module_& m);
void bind_quantizer(pybind11::module_& m);
void bind_deploy(pybind11::module_& m);
}  // namespace python
}  // namespace mqbench

PYBIND11_MODULE(_C, m) {
  m.doc() = "Native core of mqbench (libmqbench). Ops live under torch.ops.mqbench.";
  m.attr("__version__") = mqbench::version();
  // The torch release the binary parts were compiled against (mqbench/__init__.py checks it).
  m.attr("__torch_version__") = MQBENCH_TORCH_VERSION_STRING;
  m.attr("__cuda__") =
#ifdef MQBENCH_WITH_CUDA
      true;
#else
      false;
#endif
  mqbench::python::bind_ops(m);
  mqbench::python::bind_backends(m);
  mqbench::python::bind_quantizer(m);
  mqbench::python::bind_deploy(m);
}
