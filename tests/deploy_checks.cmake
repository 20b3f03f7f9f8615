# The checking build of the deploy part (docs/security.md): configures WORK_DIR with clang,
# MQBENCH_DEPLOY_ONLY, AddressSanitizer + UndefinedBehaviorSanitizer and the libFuzzer target,
# builds it, and runs its CTest suite: the deploy GoogleTest suite and the Python suite's CLI
# tests (driving the sanitized mqbench-deploy) under the sanitizers, then a short fuzz run per
# translator from tests/fuzz/corpus.
# Inputs: SOURCE_DIR, WORK_DIR, TEST_PYTHON, FUZZ_SECONDS.

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "deploy_checks: command failed (${rc}): ${cmd}")
  endif()
endfunction()

find_program(CLANGXX NAMES clang++-14 clang++)
find_program(CLANG NAMES clang-14 clang)
if(NOT CLANGXX OR NOT CLANG)
  message(FATAL_ERROR "deploy_checks: clang is missing (scripts/setup.sh installs clang-14 and "
                      "libclang-rt-14-dev)")
endif()
if(NOT EXISTS ${WORK_DIR}/build.ninja)
  run(${CMAKE_COMMAND} -E env CC=${CLANG} CXX=${CLANGXX}
      ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
      -DMQBENCH_DEPLOY_ONLY=ON -DMQBENCH_BUILD_FUZZERS=ON -DMQBENCH_SANITIZE=address,undefined
      -DMQBENCH_TEST_PYTHON=${TEST_PYTHON} -DMQBENCH_FUZZ_SECONDS=${FUZZ_SECONDS})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR})
get_filename_component(_bin ${CMAKE_COMMAND} DIRECTORY)
run(${_bin}/ctest --test-dir ${WORK_DIR} --output-on-failure)
message(STATUS "deploy_checks: sanitized deploy tests and the fuzz runs passed in ${WORK_DIR}")
