# libonnx (checker, shape inference, the operator schemas) compiled from onnx's source release into
# libmqbench_deploy, in place of Debian's libonnx 1.12, whose schemas end at opset 17
# (docs/design/deploy.md says why).
#
# The source is the PyPI sdist of the onnx the Python side pins (requirements-dev.txt), unpacked by
# scripts/setup.sh into third_party/ (folder onnx-<version>, not in git); override with
# -DMQBENCH_ONNX_SOURCE_DIR. Its C++ is compiled with the project's compiler and flags (and its
# sanitizers in the sanitized builds), protobuf is Debian's (the protoc and libprotobuf the deploy
# always used). The objects go into libmqbench_deploy only, so one process holds one copy of the
# ONNX protobuf descriptors; `onnx_proto` and `onnx` are the names the rest of the build links
# for the headers.
#
# Defines: the OBJECT library mqbench_onnx, the INTERFACE libraries onnx_proto and onnx.

include(GNUInstallDirs)
set(MQBENCH_ONNX_VERSION 1.23.2)
set(MQBENCH_ONNX_SOURCE_DIR "${PROJECT_SOURCE_DIR}/third_party/onnx-${MQBENCH_ONNX_VERSION}"
    CACHE PATH "onnx ${MQBENCH_ONNX_VERSION}'s source (the PyPI sdist, unpacked)")
if(NOT EXISTS "${MQBENCH_ONNX_SOURCE_DIR}/onnx/checker.cc")
  message(FATAL_ERROR "mqbench: onnx ${MQBENCH_ONNX_VERSION}'s source is missing from "
                      "${MQBENCH_ONNX_SOURCE_DIR}; scripts/setup.sh fetches it from PyPI")
endif()
find_package(Protobuf REQUIRED)

# The .proto files of the sdist are already generated for namespace `onnx` with ONNX_ML.
set(_onnx_gen "${CMAKE_BINARY_DIR}/onnx-gen")
file(MAKE_DIRECTORY "${_onnx_gen}/onnx")
set(_onnx_pb_sources)
foreach(_proto onnx-ml onnx-operators-ml onnx-data)
  configure_file("${MQBENCH_ONNX_SOURCE_DIR}/onnx/${_proto}.proto" "${_onnx_gen}/onnx/${_proto}.proto"
                 COPYONLY)
  add_custom_command(
    OUTPUT "${_onnx_gen}/onnx/${_proto}.pb.cc" "${_onnx_gen}/onnx/${_proto}.pb.h"
    COMMAND protobuf::protoc -I "${_onnx_gen}" --cpp_out "${_onnx_gen}"
            "${_onnx_gen}/onnx/${_proto}.proto"
    DEPENDS "${_onnx_gen}/onnx/${_proto}.proto" protobuf::protoc
    COMMENT "protoc onnx/${_proto}.proto")
  list(APPEND _onnx_pb_sources "${_onnx_gen}/onnx/${_proto}.pb.cc")
endforeach()

# checker, shape inference, the schemas of every domain and opset, and what they use (the
# inliner, which calls the version converter; not the Python bindings or the tests). An explicit list: a new onnx release is
# a reviewed change of this file.
set(_onnx_sources checker.cc common/assertions.cc common/interned_strings.cc
  common/ir_pb_converter.cc common/model_helpers.cc common/status.cc defs/attr_proto_util.cc
  defs/controlflow/defs.cc defs/controlflow/old.cc defs/controlflow/utils.cc
  defs/data_type_utils.cc defs/doc_strings.cc defs/function.cc defs/generator/defs.cc
  defs/generator/old.cc defs/generator/utils.cc defs/image/defs.cc defs/logical/defs.cc
  defs/logical/old.cc defs/math/defs.cc defs/math/old.cc defs/math/utils.cc defs/nn/defs.cc
  defs/nn/old.cc defs/nn/utils.cc defs/object_detection/defs.cc defs/object_detection/old.cc
  defs/optional/defs.cc defs/optional/old.cc defs/optional/utils.cc defs/parser.cc
  defs/preview/defs.cc defs/printer.cc defs/quantization/defs.cc defs/quantization/old.cc
  defs/reduction/defs.cc defs/reduction/old.cc defs/reduction/utils.cc defs/rnn/defs.cc
  defs/rnn/old.cc defs/schema.cc defs/sequence/defs.cc defs/sequence/old.cc
  defs/sequence/utils.cc defs/shape_inference.cc defs/tensor/defs.cc defs/tensor/old.cc
  defs/tensor/utils.cc defs/tensor_proto_util.cc defs/tensor_util.cc defs/text/defs.cc
  defs/traditionalml/defs.cc defs/traditionalml/old.cc defs/training/defs.cc inliner/inliner.cc
  shape_inference/implementation.cc version_converter/convert.cc version_converter/helper.cc)
list(TRANSFORM _onnx_sources PREPEND "${MQBENCH_ONNX_SOURCE_DIR}/onnx/")

add_library(mqbench_onnx OBJECT ${_onnx_sources} ${_onnx_pb_sources})
set_target_properties(mqbench_onnx PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_features(mqbench_onnx PUBLIC cxx_std_17)
# ONNX_BUILD_MAIN_LIB: its API is exported from the library that holds it (libmqbench_deploy).
target_compile_definitions(mqbench_onnx PUBLIC ONNX_ML=1 ONNX_NAMESPACE=onnx
                                        PRIVATE ONNX_BUILD_MAIN_LIB)
target_include_directories(mqbench_onnx SYSTEM PUBLIC
  $<BUILD_INTERFACE:${MQBENCH_ONNX_SOURCE_DIR}> $<BUILD_INTERFACE:${_onnx_gen}>)
target_link_libraries(mqbench_onnx PUBLIC protobuf::libprotobuf)
# Not our code: its warnings are onnx's to fix (the CI build makes ours errors).
target_compile_options(mqbench_onnx PRIVATE -w)

# The names the deploy, its tests and the fuzzer link: headers and definitions only (the code is
# in libmqbench_deploy). Installed with mqbench (find_package(mqbench) consumers include the
# deploy's headers, which include onnx's protobuf classes).
add_library(onnx_proto INTERFACE)
target_compile_definitions(onnx_proto INTERFACE ONNX_ML=1 ONNX_NAMESPACE=onnx)
target_include_directories(onnx_proto SYSTEM INTERFACE
  $<BUILD_INTERFACE:${MQBENCH_ONNX_SOURCE_DIR}> $<BUILD_INTERFACE:${_onnx_gen}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/mqbench/onnx>)
target_link_libraries(onnx_proto INTERFACE protobuf::libprotobuf)
set_target_properties(onnx_proto PROPERTIES EXPORT_NAME onnx_proto)
add_library(onnx INTERFACE)
target_link_libraries(onnx INTERFACE onnx_proto)
add_dependencies(onnx_proto mqbench_onnx)  # the generated headers exist before a consumer compiles
