# Installs the freshly built mqbench into a scratch prefix, configures and builds the outside
# project examples/cpp against it with find_package(mqbench), and runs it.
# Inputs: MQBENCH_BUILD_DIR, CONSUMER_SOURCE_DIR, WORK_DIR.

set(RUN_WHAT "consumer")
include(${CMAKE_CURRENT_LIST_DIR}/../run_command.cmake)

set(prefix ${WORK_DIR}/install)
file(REMOVE_RECURSE ${prefix})
run(${CMAKE_COMMAND} --install ${MQBENCH_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/quantize_conv ${WORK_DIR}/deploy)
foreach(f conv_clip_ranges.json conv_calib.cache conv_deploy_model.onnx onnx_quantized_model.onnx)
  if(NOT EXISTS ${WORK_DIR}/deploy/${f})
    message(FATAL_ERROR "consumer: quantize_conv did not write ${f}")
  endif()
endforeach()
run(${WORK_DIR}/build/custom_backend)
message(STATUS "consumer: built and ran examples/cpp against ${prefix}")
