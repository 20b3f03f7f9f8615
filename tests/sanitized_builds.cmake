# Checking builds (docs/security.md, docs/design/build-and-ci.md), driven from CTest.
#
# KIND=deploy: configures WORK_DIR with clang, MQBENCH_DEPLOY_ONLY, AddressSanitizer +
#   UndefinedBehaviorSanitizer and the libFuzzer target, builds it, and runs its CTest suite: the
#   deploy GoogleTest suite and the Python suite's CLI tests (driving the sanitized mqbench-deploy)
#   under the sanitizers, then a short fuzz run per translator from tests/fuzz/corpus.
# KIND=torch: configures WORK_DIR with the default compiler (gcc), the torch of TEST_PYTHON and
#   the sanitizers, no Python module and no CUDA, builds the C++ unit tests of the ops, observers
#   and quantizer, and runs them on the best and on the baseline CPU kernels. The deploy part is
#   not compiled again: the tests link PREBUILT_DEPLOY's libmqbench_deploy (the main build's;
#   cmake/PrebuiltDeploy.cmake), which KIND=deploy checks under the sanitizers.
# Inputs: KIND, SOURCE_DIR, WORK_DIR, TEST_PYTHON, FUZZ_RUNS (deploy), PREBUILT_DEPLOY (torch).

set(RUN_WHAT "sanitized_builds (${KIND})")
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)

set(sanitizer_env
  "ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:exitcode=86"
  "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86")

if(KIND STREQUAL "deploy")
  find_program(CLANGXX NAMES clang++-14 clang++)
  find_program(CLANG NAMES clang-14 clang)
  if(NOT CLANGXX OR NOT CLANG)
    message(FATAL_ERROR "sanitized_builds: clang is missing (scripts/setup.sh installs clang-14 "
                        "and libclang-rt-14-dev)")
  endif()
  if(NOT EXISTS ${WORK_DIR}/build.ninja)
    run(${CMAKE_COMMAND} -E env CC=${CLANG} CXX=${CLANGXX}
        ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
        -DMQBENCH_DEPLOY_ONLY=ON -DMQBENCH_BUILD_FUZZERS=ON -DMQBENCH_SANITIZE=address,undefined
        -DMQBENCH_TEST_PYTHON=${TEST_PYTHON} -DMQBENCH_FUZZ_RUNS=${FUZZ_RUNS})
  endif()
  run(${CMAKE_COMMAND} --build ${WORK_DIR})
  get_filename_component(_bin ${CMAKE_COMMAND} DIRECTORY)
  file(REMOVE ${WORK_DIR}/findings.txt)
  execute_process(COMMAND ${_bin}/ctest --test-dir ${WORK_DIR} --output-on-failure RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    # The fuzzers' output is long and a CI log may keep only parts of it, its last two thousand
    # characters or so: repeat each finding's input (zlib + base64, to copy from a log) and then
    # what was found, shortened, in this test's last lines, in its error message (a CI summary
    # may quote just that) and in WORK_DIR/findings.txt, which scripts/test.sh prints again
    # after CTest's own summary. What was found comes last, so a log cut short still says it.
    set(findings "")
    file(GLOB artifacts ${WORK_DIR}/tests/fuzz/fuzz-artifacts/*)
    foreach(a IN LISTS artifacts)
      execute_process(COMMAND ${TEST_PYTHON} -c
        "import base64,sys,zlib; d=open(sys.argv[1],'rb').read(); print(len(d), 'bytes; zlib+base64:', base64.b64encode(zlib.compress(d, 9)).decode())"
        ${a} OUTPUT_VARIABLE encoded OUTPUT_STRIP_TRAILING_WHITESPACE)
      get_filename_component(name ${a} NAME)
      string(APPEND findings "finding input ${name}: ${encoded}\n")
    endforeach()
    set(log ${WORK_DIR}/Testing/Temporary/LastTest.log)
    if(EXISTS ${log})
      file(STRINGS ${log} found REGEX
           "deploy_fuzzer: backend|SUMMARY: [A-Za-z]+Sanitizer|runtime error:|ALARM|out-of-memory|Test Failed|\\[  FAILED  \\]")
      foreach(line IN LISTS found)
        string(SUBSTRING "${line}" 0 300 line)
        string(APPEND findings "found: ${line}\n")
      endforeach()
    endif()
    file(WRITE ${WORK_DIR}/findings.txt "${findings}")
    message(STATUS "${findings}")
    message(FATAL_ERROR "${RUN_WHAT}: the sanitized deploy's tests failed (${rc}):\n${findings}"
                        "(tests/fuzz/README.md says how to reproduce an input)")
  endif()
elseif(KIND STREQUAL "torch")
  if(NOT EXISTS ${WORK_DIR}/build.ninja)
    run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G Ninja -DCMAKE_BUILD_TYPE=Release
        -DPython_EXECUTABLE=${TEST_PYTHON} -DMQBENCH_SANITIZE=address,undefined
        -DMQBENCH_BUILD_PYTHON=OFF -DMQBENCH_CUDA=OFF -DMQBENCH_PREBUILT_DEPLOY=${PREBUILT_DEPLOY})
  endif()
  run(${CMAKE_COMMAND} --build ${WORK_DIR} --target mqbench_cpp_tests)
  foreach(isa best default)
    set(env ${sanitizer_env})
    if(isa STREQUAL "default")
      list(APPEND env MQBENCH_CPU_CAPABILITY=default)
    endif()
    run(${CMAKE_COMMAND} -E env ${env} ${WORK_DIR}/tests/mqbench_cpp_tests --gtest_brief=1)
  endforeach()
else()
  message(FATAL_ERROR "sanitized_builds: KIND must be deploy or torch, got '${KIND}'")
endif()
message(STATUS "sanitized_builds (${KIND}): passed in ${WORK_DIR}")
