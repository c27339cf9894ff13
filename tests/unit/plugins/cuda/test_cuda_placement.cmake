# test_cuda_placement compiles the cuda device's GPU placement itself: it is
# host-only C, so it is tested with or without a CUDA toolkit.
target_sources(test_cuda_placement PRIVATE "${PROJECT_SOURCE_DIR}/plugins/cuda/cuda_placement.c")
