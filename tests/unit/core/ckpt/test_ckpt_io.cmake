# Its cases by concern, in the files beside test_ckpt_io.c (ckpt_io_test.h).
target_sources(test_ckpt_io PRIVATE
  "${CMAKE_CURRENT_LIST_DIR}/ckpt_io_fixture.c"
  "${CMAKE_CURRENT_LIST_DIR}/ckpt_io_fileutil.c"
  "${CMAKE_CURRENT_LIST_DIR}/ckpt_io_write_read.c"
  "${CMAKE_CURRENT_LIST_DIR}/ckpt_io_corruption.c"
  "${CMAKE_CURRENT_LIST_DIR}/ckpt_io_resharding.c")
