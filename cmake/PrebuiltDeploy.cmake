# Links the deploy part that another build tree of this source compiled, instead of compiling it
# (and onnx's C++) again: the sanitized build of the ops (tests/sanitized_builds.cmake, KIND=torch)
# links the main build's libmqbench_deploy. The deploy part has its own sanitized and fuzzed build;
# AddressSanitizer and UBSan work across an uninstrumented library (they check our torch-side code,
# not the library's). docs/design/build-and-ci.md says why.
#
# Input: MQBENCH_PREBUILT_DEPLOY, the other tree's build folder (configured and built).
# Defines: the INTERFACE libraries onnx_proto and onnx (headers: onnx's source and that tree's
# generated protobuf classes), the IMPORTED shared library mqbench_deploy.

set(_tree "${MQBENCH_PREBUILT_DEPLOY}")
set(_lib "${_tree}/libmqbench_deploy.so.${PROJECT_VERSION}")
if(NOT EXISTS "${_lib}" OR NOT EXISTS "${_tree}/onnx-gen/onnx/onnx-ml.pb.h")
  message(FATAL_ERROR "mqbench: MQBENCH_PREBUILT_DEPLOY=${_tree} holds no built deploy part "
                      "(libmqbench_deploy.so.${PROJECT_VERSION} and onnx-gen/); build that tree first")
endif()
load_cache("${_tree}" READ_WITH_PREFIX _prebuilt_ MQBENCH_ONNX_SOURCE_DIR)
if(NOT EXISTS "${_prebuilt_MQBENCH_ONNX_SOURCE_DIR}/onnx/onnx_pb.h")
  message(FATAL_ERROR "mqbench: ${_tree}'s onnx source (${_prebuilt_MQBENCH_ONNX_SOURCE_DIR}) is gone")
endif()
find_package(Protobuf REQUIRED)

add_library(onnx_proto INTERFACE)
target_compile_definitions(onnx_proto INTERFACE ONNX_ML=1 ONNX_NAMESPACE=onnx)
target_include_directories(onnx_proto SYSTEM INTERFACE
  "${_prebuilt_MQBENCH_ONNX_SOURCE_DIR}" "${_tree}/onnx-gen")
target_link_libraries(onnx_proto INTERFACE protobuf::libprotobuf)
add_library(onnx INTERFACE)
target_link_libraries(onnx INTERFACE onnx_proto)

add_library(mqbench_deploy SHARED IMPORTED GLOBAL)
set_target_properties(mqbench_deploy PROPERTIES
  IMPORTED_LOCATION "${_lib}"
  IMPORTED_SONAME "libmqbench_deploy.so.${PROJECT_VERSION_MAJOR}"
  INTERFACE_INCLUDE_DIRECTORIES "${PROJECT_SOURCE_DIR}/include"
  INTERFACE_LINK_LIBRARIES onnx_proto
  # Backends and translators register themselves from static initialisers.
  INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed")
add_library(mqbench::deploy ALIAS mqbench_deploy)
