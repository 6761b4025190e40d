# Runs tessel-mpi-failure under mpiexec (cmake -P) and checks that every rank but the failing
# one (rank 1) reports an error naming the collective and rank 1, and that the job's exit status
# is non-zero: a failure on one process makes the others fail, never hang (the CTest TIMEOUT
# guards against a hang), and the launcher sees it.
#   -DMPIEXEC=... -DNP=4 -DEXE=... -DMODE=throw|kill|late|exit|badload|nohost|ok [-DLAUNCH=keep|plain]
#   [-DTIMEOUT=S] [-DMAX_SECONDS=S]
# LAUNCH=keep (default): Open MPI is asked to keep the other processes running when one exits
# non-zero or dies (--mca orte_abort_on_non_zero_status 0, what docs/runtime-mpi.md
# recommends), so every rank reports; abort_job_on_error then ends the job non-zero.
# LAUNCH=plain: mpirun's defaults; it kills the job within about a second of a death or a
# non-zero exit and names the rank itself.
execute_process(COMMAND ${MPIEXEC} --version OUTPUT_VARIABLE _ver ERROR_VARIABLE _ver)
if(NOT LAUNCH)
  set(LAUNCH keep)
endif()
set(_flags "")
if(_ver MATCHES "Open MPI|OpenRTE")
  set(_flags --oversubscribe --allow-run-as-root)
  if(LAUNCH STREQUAL "keep")
    list(APPEND _flags --mca orte_abort_on_non_zero_status 0)
  endif()
endif()
# The timeout is how a killed rank is noticed; a throwing rank is reported at once through
# the abort channel, so its timeout only bounds a slow, loaded machine (CI runs sanitizer
# builds beside these tests).
if(TIMEOUT)
  set(_timeout ${TIMEOUT})  # -DTIMEOUT=300: the default a user has
elseif(MODE MATCHES "^(late|exit|badload|nohost)$")
  set(_timeout 10)  # late: rank 1 sleeps twice this long before load
else()
  set(_timeout 30)
endif()
string(TIMESTAMP _t0 "%s")
execute_process(COMMAND ${MPIEXEC} ${_flags} -np ${NP} ${EXE} ${MODE} --timeout ${_timeout}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(TIMESTAMP _t1 "%s")
math(EXPR _elapsed "${_t1} - ${_t0}")
message("the job took ${_elapsed} s (collective timeout ${_timeout} s)")
# -DMAX_SECONDS: the job must end (every rank having reported) within this, whatever the timeout.
if(MAX_SECONDS AND _elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "the job took ${_elapsed} s, more than ${MAX_SECONDS} s, to notice rank 1's failure:\n${out}\n${err}")
endif()
message("${out}")
message("mpiexec exit status: ${rc}")
if(MODE STREQUAL "ok")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpiexec failed (${rc}):\n${err}")
  endif()
elseif(rc EQUAL 0)
  message(FATAL_ERROR "a failed job ended with exit status 0 (mode ${MODE}, launch ${LAUNCH}):\n${out}\n${err}")
endif()
if(LAUNCH STREQUAL "plain" AND NOT MODE STREQUAL "ok")
  # mpirun's defaults: the job is killed at once; mpirun (or rank 1 itself) names rank 1.
  if(NOT "${out}${err}" MATCHES "process rank 1 with PID [0-9]+ on node [^\n]* exited on signal 9|rank 1: error: [^\n]*outside|rank 1: error: [^\n]*out of")
    message(FATAL_ERROR "neither mpirun nor rank 1 named rank 1's failure:\n${out}\n${err}")
  endif()
  return()
endif()
math(EXPR _last "${NP} - 1")
foreach(r RANGE 0 ${_last})
  if(r EQUAL 1)
    continue()
  endif()
  if(MODE STREQUAL "ok")
    if(NOT out MATCHES "rank ${r}: ok")
      message(FATAL_ERROR "rank ${r} did not finish:\n${out}\n${err}")
    endif()
  elseif(MODE MATCHES "^(late|exit|badload)$")
    # Rank 1 is stuck before load, exited, or failed in load on its own: every other rank's
    # load times out naming it (its program fingerprint never comes), or stops on the abort
    # of a rank that timed out first.
    # A rank that exited is noticed at once (liveness: its process is gone), the others time out.
    if(NOT out MATCHES "rank ${r}: error: load, exchanging the program fingerprints: [^\n]*allgather_host[^\n]*(timed out after [0-9.]+ s waiting for rank 1|stopped: [^\n]*waiting for rank 1|stopped: rank [0-9]+: the process of rank 1 \\(pid [0-9]+ on this host|the job failed earlier \\(rank [0-9]+: the process of rank 1 \\(pid [0-9]+ on this host)")
      message(FATAL_ERROR "rank ${r} did not report that load waited for rank 1:\n${out}\n${err}")
    endif()
  elseif(MODE STREQUAL "nohost")
    # Rank 1 is alive but never comes to to_host: the others' gather names it.
    if(NOT out MATCHES "rank ${r}: error: [^\n]*to_host \\(gathering every process's shards\\) (timed out after [0-9.]+ s waiting for rank 1 |stopped: [^\n]*waiting for rank 1 )")
      message(FATAL_ERROR "rank ${r} did not report that to_host waited for rank 1:\n${out}\n${err}")
    endif()
  elseif(MODE STREQUAL "throw")
    # A rank blocked in the all-reduce names it; a rank the abort reaches before it gets
    # there (a race on a loaded machine: still in load, or between load and run) fails at
    # once naming rank 1's failure.
    if(NOT out MATCHES "rank ${r}: error: [^\n]*all_reduce over \\{data\\}[^\n]*stopped: rank 1: device 1 failed:[^\n]*out"
       AND NOT out MATCHES "rank ${r}: error: [^\n]*the job failed earlier \\(rank 1: device 1 failed:[^\n]*out"
       AND NOT out MATCHES "rank ${r}: error: rank ${r}: load, [^\n]*stopped: rank 1: device 1 failed:[^\n]*out"
       AND NOT out MATCHES "rank ${r}: error: [^\n]*all_reduce over \\{data\\}[^\n]*timed out after [0-9]+ s waiting for device 1 on rank 1")
      message(FATAL_ERROR "rank ${r} did not report rank 1's failure in the all_reduce:\n${out}\n${err}")
    endif()
  else()
    # Killed: noticed within about a second through /proc (liveness), long before the timeout.
    if(NOT out MATCHES "rank ${r}: error: [^\n]*(all_reduce over \\{data\\}[^\n]*(waiting for device 1 on rank 1|stopped: rank [0-9]+: [^\n]*waiting for device 1 on rank 1)|stopped: rank [0-9]+: the process of rank 1 \\(pid [0-9]+ on this host[^\n]*is gone)")
      message(FATAL_ERROR "rank ${r} did not report the collective and the dead rank 1:\n${out}\n${err}")
    endif()
  endif()
endforeach()
if(MODE STREQUAL "badload" AND NOT out MATCHES "rank 1: error: [^\n]*no output %no_such_output")
  message(FATAL_ERROR "rank 1 did not report its own failure in load:\n${out}\n${err}")
endif()
if(MODE STREQUAL "throw" AND NOT out MATCHES "rank 1: error: [^\n]*gather[^\n]*out of|rank 1: error: [^\n]*outside")
  message(FATAL_ERROR "rank 1 did not report its own failure:\n${out}\n${err}")
endif()
