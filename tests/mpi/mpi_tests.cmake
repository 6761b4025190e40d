# The MPI tests (label mpi), included from tests/CMakeLists.txt when TESSEL_WITH_MPI is ON:
# the Catch2 MPI suite on 2 and 4 processes, the failure driver (a throwing rank, a killed
# rank), and the gpt example under mpiexec with one and two devices per process. Processes
# talk over loopback / shared memory; Open MPI needs --oversubscribe on a 2-core machine and
# permission to run as root (CI runs as root): both are given through the environment
# (OMPI_* variables, ignored by other MPIs).
if(NOT TESSEL_WITH_MPI)
  return()
endif()
# Not in the sanitizer builds (scripts/test-sanitizers): libmpi is not instrumented, so TSan
# reports its internal synchronisation as races and LSan its one-time allocations as leaks.
# The in-process runtime (the same executor, streams and thread communicator) is covered there.
if(TESSEL_SANITIZE_ADDRESS OR TESSEL_SANITIZE_THREAD)
  return()
endif()
set(_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;TESSEL_MPI_TIMEOUT_S=120")

add_executable(tessel_tests_mpi ${CMAKE_CURRENT_LIST_DIR}/../main.cpp ${CMAKE_CURRENT_LIST_DIR}/test_mpi.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/test_mpi_pool.cpp)
target_link_libraries(tessel_tests_mpi PRIVATE tessel::tessel Catch2::Catch2 fmt::fmt MPI::MPI_CXX)
target_compile_options(tessel_tests_mpi PRIVATE ${TESSEL_TEST_WARNINGS})
target_compile_definitions(tessel_tests_mpi PRIVATE
  TESSEL_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TESSEL_BINARY_DIR="${CMAKE_BINARY_DIR}")

add_executable(tessel_mpi_failure ${CMAKE_CURRENT_LIST_DIR}/mpi_failure.cpp)
target_link_libraries(tessel_mpi_failure PRIVATE tessel::tessel fmt::fmt)
target_compile_options(tessel_mpi_failure PRIVATE ${TESSEL_TEST_WARNINGS})
set_target_properties(tessel_mpi_failure PROPERTIES OUTPUT_NAME tessel-mpi-failure)
# Issue 36 item 7: --help prints the usage without starting MPI or a job; a mistyped mode is
# refused (status 2) instead of running the control.
add_test(NAME "mpi: tessel-mpi-failure --help prints its usage" COMMAND tessel_mpi_failure --help)
set_tests_properties("mpi: tessel-mpi-failure --help prints its usage" PROPERTIES
                     PASS_REGULAR_EXPRESSION "usage: mpirun -np N tessel-mpi-failure MODE")
add_test(NAME "mpi: tessel-mpi-failure refuses an unknown mode" COMMAND tessel_mpi_failure trhow)
set_tests_properties("mpi: tessel-mpi-failure refuses an unknown mode" PROPERTIES
                     PASS_REGULAR_EXPRESSION "tessel-mpi-failure: error: unknown mode 'trhow'")

set(_mpi_tests "")
foreach(np 2 4)
  add_test(NAME "mpi: suite on ${np} processes"
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:tessel_tests_mpi> ${MPIEXEC_POSTFLAGS})
  list(APPEND _mpi_tests "mpi: suite on ${np} processes")
endforeach()
foreach(mode ok throw kill late exit badload nohost)
  add_test(NAME "mpi: failure '${mode}' on rank 1 of 4"
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DNP=4 -DEXE=$<TARGET_FILE:tessel_mpi_failure>
                   -DMODE=${mode} -P ${CMAKE_CURRENT_LIST_DIR}/run_failure.cmake)
  list(APPEND _mpi_tests "mpi: failure '${mode}' on rank 1 of 4")
endforeach()
# Issue 36 item 4: at the default collective timeout (300 s) a killed or exited rank is noticed
# in seconds (liveness: its process is gone), not after the timeout: the job, 8 s of grace
# included, ends within 60 s, every rank naming rank 1.
foreach(mode kill exit)
  set(_what "a kill")
  if(mode STREQUAL "exit")
    set(_what "an exit")
  endif()
  add_test(NAME "mpi: ${_what} of rank 1 is noticed in seconds at the default timeout"
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DNP=4 -DEXE=$<TARGET_FILE:tessel_mpi_failure>
                   -DMODE=${mode} -DTIMEOUT=300 -DMAX_SECONDS=60 -P ${CMAKE_CURRENT_LIST_DIR}/run_failure.cmake)
  list(APPEND _mpi_tests "mpi: ${_what} of rank 1 is noticed in seconds at the default timeout")
endforeach()
foreach(mode throw kill)  # mpirun's defaults: the job ends at once, non-zero, naming rank 1
  add_test(NAME "mpi: failure '${mode}' on rank 1 of 4 under plain mpirun"
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DNP=4 -DEXE=$<TARGET_FILE:tessel_mpi_failure>
                   -DMODE=${mode} -DLAUNCH=plain -P ${CMAKE_CURRENT_LIST_DIR}/run_failure.cmake)
  list(APPEND _mpi_tests "mpi: failure '${mode}' on rank 1 of 4 under plain mpirun")
endforeach()
# The documented commands, exactly as docs/runtime-mpi.md and docs/training.md write them for
# root on a machine with fewer cores than processes (`mpirun --allow-run-as-root
# --oversubscribe -np N build/bin/...`): no --seed, no test-only flag or variable. Each
# process draws its own default seed; the tools must agree on rank 0's (agree_on_seed).
get_filename_component(_mpi_bin_dir "${MPIEXEC_EXECUTABLE}" DIRECTORY)
find_program(TESSEL_MPIRUN NAMES mpirun HINTS "${_mpi_bin_dir}")
set(_mpirun_doc ${TESSEL_MPIRUN} --allow-run-as-root --oversubscribe)
set(_mpi_doc_tests "")
if(TARGET tessel_example_gpt AND TESSEL_MPIRUN)
  foreach(np 4 2)
    add_test(NAME "mpi: documented mpirun -np ${np} gpt --mesh data=2 model=2 matches one device"
             COMMAND ${_mpirun_doc} -np ${np} $<TARGET_FILE:tessel_example_gpt> --mesh data=2,model=2)
    set_tests_properties("mpi: documented mpirun -np ${np} gpt --mesh data=2 model=2 matches one device" PROPERTIES
                         FAIL_REGULAR_EXPRESSION "FAILED")
    list(APPEND _mpi_doc_tests "mpi: documented mpirun -np ${np} gpt --mesh data=2 model=2 matches one device")
  endforeach()
  # --layouts auto under mpirun: every process adopts rank 0's plan (a time-limited search can
  # end differently per process), and the forward matches one device.
  add_test(NAME "mpi: mpirun -np 2 gpt --layouts auto matches one device"
           COMMAND ${_mpirun_doc} -np 2 $<TARGET_FILE:tessel_example_gpt> --mesh data=2,model=2 --layouts auto)
  set_tests_properties("mpi: mpirun -np 2 gpt --layouts auto matches one device" PROPERTIES
                       FAIL_REGULAR_EXPRESSION "FAILED" PASS_REGULAR_EXPRESSION "relative difference = .* [(]ok")
  list(APPEND _mpi_doc_tests "mpi: mpirun -np 2 gpt --layouts auto matches one device")
  # mlp runs on the threads of one process: under mpirun it says so instead of running the
  # whole job once per process.
  add_test(NAME "mpi: mlp under mpirun -np 2 refuses to run the job twice"
           COMMAND ${_mpirun_doc} -np 2 $<TARGET_FILE:tessel_example_mlp>)
  set_tests_properties("mpi: mlp under mpirun -np 2 refuses to run the job twice" PROPERTIES
                       PASS_REGULAR_EXPRESSION "mlp runs every device as a thread of one process, but a launcher [(]mpirun[)] started 2 processes")
  list(APPEND _mpi_doc_tests "mpi: mlp under mpirun -np 2 refuses to run the job twice")
  # CUDA pipeline stages run in one process: under a launcher each process says so, naming its rank.
  add_test(NAME "mpi: mpirun -np 2 gpt_train --backend cuda with a pipe axis is refused naming the rank"
           COMMAND ${_mpirun_doc} -np 2 $<TARGET_FILE:tessel_example_gpt_train> --backend cuda --mesh pipe=2 --steps 1)
  set_tests_properties("mpi: mpirun -np 2 gpt_train --backend cuda with a pipe axis is refused naming the rank" PROPERTIES
                       PASS_REGULAR_EXPRESSION "with a pipe axis in --mesh runs in one process .* [(]rank [01] of 2 here[)]")
  list(APPEND _mpi_doc_tests "mpi: mpirun -np 2 gpt_train --backend cuda with a pipe axis is refused naming the rank")
endif()
# gpt_train's checkpoints saved and resumed under mpirun (tests/integration/test_gpt_train_checkpoints.cpp).
if(TARGET tessel_tests_integration AND TESSEL_MPIRUN)
  target_compile_definitions(tessel_tests_integration PRIVATE TESSEL_TEST_MPIRUN="${TESSEL_MPIRUN}")
endif()
if(TARGET tessel_example_gpt_train AND TESSEL_MPIRUN)
  add_test(NAME "mpi: documented mpirun -np 2 gpt_train --mesh data=2 model=2 --zero 2 matches one device"
           COMMAND ${_mpirun_doc} -np 2 $<TARGET_FILE:tessel_example_gpt_train> --mesh data=2,model=2 --zero 2)
  list(APPEND _mpi_doc_tests "mpi: documented mpirun -np 2 gpt_train --mesh data=2 model=2 --zero 2 matches one device")
  # docs/training.md, "Automatic layouts": each process searches, rank 0's plan is adopted.
  add_test(NAME "mpi: documented mpirun -np 2 gpt_train --mesh data=2 model=2 --auto matches one device"
           COMMAND ${_mpirun_doc} -np 2 $<TARGET_FILE:tessel_example_gpt_train> --mesh data=2,model=2 --auto)
  list(APPEND _mpi_doc_tests "mpi: documented mpirun -np 2 gpt_train --mesh data=2 model=2 --auto matches one device")
endif()
# docs/planner.md, "One process per device": tessel-plan --run under mpirun, one process per
# device, as written (tests/integration/planner_doc_commands.sh picks the mpirun lines).
if(TARGET tessel_example_plan AND TESSEL_MPIRUN)
  add_test(NAME "mpi: documented mpirun -np 8 tessel-plan --run runs the plan with one process per device"
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/integration/planner_doc_commands.sh
                   $<TARGET_FILE_DIR:tessel_example_plan> ${PROJECT_SOURCE_DIR}
                   ${CMAKE_BINARY_DIR}/tests/planner-doc-commands-mpi mpi)
  list(APPEND _mpi_doc_tests "mpi: documented mpirun -np 8 tessel-plan --run runs the plan with one process per device")
  # --backend cuda on a machine without a GPU (or a build without CUDA): every process ends,
  # non-zero, with an error naming the job and what is missing.
  add_test(NAME "mpi: tessel-plan --run --backend cuda without a GPU names the job and the missing GPU"
           COMMAND bash -c "out=$(${TESSEL_MPIRUN} --allow-run-as-root --oversubscribe -np 8 $<TARGET_FILE:tessel_example_plan> ${PROJECT_SOURCE_DIR}/examples/planner/gpt_jobs.json --pool ${PROJECT_SOURCE_DIR}/examples/planner/cpu_pool.json --run --backend cuda --no-pictures 2>&1); rc=$?; echo \"$out\" | tail -5; test $rc -ne 0 && echo \"$out\" | grep -Eq \"job '[a-z-]+' failed: process [0-9]+ of devices [0-9,]+: CudaRuntime: no CUDA GPU is visible|built without CUDA\"")
  list(APPEND _mpi_doc_tests "mpi: tessel-plan --run --backend cuda without a GPU names the job and the missing GPU")
endif()
# Issue 39: gpt_train with a pipe axis under mpirun -np 4 (each stage on its own processes, the
# values between stages as host messages): every step equal to one device within 1e-5 for every
# schedule, on pipe=2 x data=2, pipe=4, pipe=2 x model=2 and interleaved pipe=2 x data=2 with 2
# chunks; a checkpoint saved by the mpirun pipeline resumes on data=4 with the uninterrupted
# losses (pipeline_checkpoint.sh with a launcher).
if(TARGET tessel_example_gpt_train AND TESSEL_MPIRUN)
  foreach(cfg "pipe=2,data=2|gpipe|" "pipe=2,data=2|1f1b|" "pipe=4|gpipe|--layers 4" "pipe=4|1f1b|--layers 4"
              "pipe=2,model=2|gpipe|" "pipe=2,model=2|1f1b|" "pipe=2,data=2|interleaved|--chunks 2 --layers 4"
              "pipe=2,data=2|zb-h1|" "pipe=4|zb-h1|--layers 4")
    string(REPLACE "|" ";" _parts "${cfg}")
    list(GET _parts 0 _mesh)
    list(GET _parts 1 _sched)
    list(GET _parts 2 _more)
    separate_arguments(_more)
    string(REPLACE "," " x " _label "${_mesh}")
    set(_name "mpi: mpirun -np 4 gpt_train --mesh ${_label} --schedule ${_sched} equals one device within 1e-5")
    add_test(NAME "${_name}"
             COMMAND ${_mpirun_doc} -np 4 $<TARGET_FILE:tessel_example_gpt_train> --mesh ${_mesh} --schedule ${_sched}
                     ${_more} --steps 3 --tolerance 1e-5 --out "")
    set_tests_properties("${_name}" PROPERTIES PASS_REGULAR_EXPRESSION
                         "4 processes, [12] per stage.*largest relative difference from one device: .* [(]ok, <= 1e-05[)]")
    list(APPEND _mpi_doc_tests "${_name}")
  endforeach()
  # --auto under mpirun: each stage's processes plan and time its pieces together (their stage's
  # rank 0's plans), every process takes rank 0's cut, shapes and layouts.
  set(_name "mpi: mpirun -np 4 gpt_train --mesh pipe=2 x data=2 --auto plans each stage and equals one device within 1e-5")
  add_test(NAME "${_name}"
           COMMAND ${_mpirun_doc} -np 4 $<TARGET_FILE:tessel_example_gpt_train> --mesh pipe=2,data=2 --auto --steps 3
                   --tolerance 1e-5 --out "")
  set_tests_properties("${_name}" PROPERTIES PASS_REGULAR_EXPRESSION
                       "each stage's layouts by automatic sharding.*4 processes, 2 per stage.*largest relative difference from one device: .* [(]ok, <= 1e-05[)]")
  list(APPEND _mpi_doc_tests "${_name}")
  add_test(NAME "mpi: mpirun -np 4 gpt_train pipe=2 x data=2 checkpoints resume on data=4 with the uninterrupted losses"
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/integration/pipeline_checkpoint.sh
                   $<TARGET_FILE_DIR:tessel_example_gpt_train> ${CMAKE_BINARY_DIR}/tests/pipeline-checkpoint-mpi
                   "${TESSEL_MPIRUN} --allow-run-as-root --oversubscribe -np 4")
  list(APPEND _mpi_doc_tests "mpi: mpirun -np 4 gpt_train pipe=2 x data=2 checkpoints resume on data=4 with the uninterrupted losses")
endif()
if(_mpi_doc_tests)
  set_tests_properties(${_mpi_doc_tests} PROPERTIES LABELS mpi TIMEOUT 300 RUN_SERIAL TRUE)
endif()
# RUN_SERIAL: 4 processes × their device and stream threads already oversubscribe 2 cores.
set_tests_properties(${_mpi_tests} PROPERTIES LABELS mpi TIMEOUT 300 RUN_SERIAL TRUE ENVIRONMENT "${_mpi_env}")
