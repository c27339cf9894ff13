# test_shm dlopens the shm plugin from the build's plugin folder and forks
# up to 8 rank processes per case.
add_dependencies(test_shm plugin_shm)
set_tests_properties(unit.test_shm PROPERTIES TIMEOUT 240 LABELS "unit;comm")
# The same battery on the portable (pre-AVX2) reduction kernels, which are
# what machines without AVX2 run.
add_test(NAME unit.test_shm_portable COMMAND test_shm)
set_tests_properties(unit.test_shm_portable PROPERTIES TIMEOUT 240 LABELS "unit;comm"
  ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT;DTRAIN_SHM_PORTABLE_KERNELS=1")
# The planted-segment cases alone (a foreign owner, links, a corrupt or
# stale header at the job's name), for the fault-injection suite.
add_test(NAME unit.test_shm_planted COMMAND test_shm)
set_tests_properties(unit.test_shm_planted PROPERTIES TIMEOUT 120 LABELS "comm;faults"
  ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT;DT_TEST_FILTER=test_planted_*")
# Its cases by concern, in the files beside test_shm.c (shm_test.h).
target_sources(test_shm PRIVATE
  "${CMAKE_CURRENT_LIST_DIR}/shm_fixture.c"
  "${CMAKE_CURRENT_LIST_DIR}/shm_collectives.c"
  "${CMAKE_CURRENT_LIST_DIR}/shm_failures.c"
  "${CMAKE_CURRENT_LIST_DIR}/shm_symmetric.c"
  "${CMAKE_CURRENT_LIST_DIR}/shm_segments.c"
  "${CMAKE_CURRENT_LIST_DIR}/shm_job_secret.c"
  "${CMAKE_CURRENT_LIST_DIR}/shm_arguments.c")
