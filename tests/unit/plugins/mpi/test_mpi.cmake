# test_mpi starts `mpirun -np 2|4 test_mpi --rank CASE` for its cases (the
# ranks dlopen the mpi plugin); where no MPI was found it only skips.
if(TARGET plugin_mpi AND MPIEXEC_EXECUTABLE)
  add_dependencies(test_mpi plugin_mpi)
  target_compile_definitions(test_mpi PRIVATE DT_TEST_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  # its application-initialised-MPI cases call MPI_Init_thread themselves
  # (imported targets are per directory: find it here too, from the cache)
  find_package(MPI COMPONENTS C QUIET)
  target_link_libraries(test_mpi PRIVATE MPI::MPI_C)
endif()
set_tests_properties(unit.test_mpi PROPERTIES TIMEOUT 400 LABELS "unit;comm")
