# run(COMMAND...): runs a command from a CMake script (-P), failing the script with the command
# line when it exits non-zero. RUN_WHAT names the caller in the message.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "${RUN_WHAT}: command failed (${rc}): ${cmd}")
  endif()
endfunction()
