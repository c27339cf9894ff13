# test_cuda_alloc compiles the cuda device's caching allocator itself: it is
# host-only C, so its bookkeeping is tested with or without a CUDA toolkit.
target_sources(test_cuda_alloc PRIVATE "${PROJECT_SOURCE_DIR}/plugins/cuda/cuda_alloc.c")
target_link_libraries(test_cuda_alloc PRIVATE dtrain_common_device)
