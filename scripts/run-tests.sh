#!/usr/bin/env bash
# Build dtrain in the configurations people actually run, with GCC and
# Clang, and run the test suite:
#
#   compiler  build type           folder                       tests
#   gcc       RelWithDebInfo       build/                       all (ctest)
#   gcc       Debug + ASan/UBSan   build-asan/                  all but one (*)
#   gcc       Release (-O3)        build-gcc-release/           unit
#   clang     Release (-O3)        build-clang-release/         unit
#   gcc       Debug                build-gcc-debug/             build only
#   clang     Debug                build-clang-debug/           build only
#   clang     RelWithDebInfo       build-clang-relwithdebinfo/  build only
#
# Every build treats warnings as errors (-DDTRAIN_WERROR=ON, whatever the
# build type's default).  The unit tests run again on both Release builds
# because optimisation is what exposes undefined behaviour and aliasing
# bugs.  (*) The sanitizer build runs every test, the fault-injection suite
# (ctest -L faults) included, but integration.sdk_local_sgd: it links the
# installed, instrumented libdtrain_sdk.a into a plugin built without
# -fsanitize, which cannot link.  Its ctest sets LSAN_OPTIONS per test
# (tests/sanitizer/lsan.supp: third-party libraries' leaks only; see
# dt_sanitizer_env in tests/CMakeLists.txt).  Each configuration opens with
# a "==== " header and the script ends with a table of times, so a CI log
# shows which configuration failed.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
current=""
timings=()
trap 'rc=$?; [ "$rc" = 0 ] || [ -z "$current" ] || echo "==== FAILED: $current (exit $rc)" >&2' EXIT

# configuration CC BUILD_TYPE DIR TESTS(all|sanitizer|unit|none) [cmake args...]
configuration() {
  local cc=$1 type=$2 dir=$3 tests=$4 cxx start=$SECONDS
  shift 4
  case $cc in
    gcc) cxx=g++ ;;
    clang) cxx=clang++ ;;
  esac
  current="$cc $type${*:+ $*} in $dir"
  echo
  echo "==== [$((${#timings[@]} + 1))] $current: build, tests: $tests"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE="$type" -DDTRAIN_WERROR=ON "$@"
  cmake --build "$dir" -j "$jobs"
  case $tests in
    all) ctest --test-dir "$dir" --output-on-failure -j "$jobs" ;;
    sanitizer) ctest --test-dir "$dir" --output-on-failure -j "$jobs" \
                 -E '^integration\.sdk_local_sgd$' ;;
    unit) ctest --test-dir "$dir" --output-on-failure -j "$jobs" -L unit ;;
  esac
  timings+=("$(printf '%5ds  %s' $((SECONDS - start)) "$current")")
}

configuration gcc RelWithDebInfo build all
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  configuration gcc Debug build-asan sanitizer -DDTRAIN_SANITIZE=ON
configuration gcc Release build-gcc-release unit
configuration clang Release build-clang-release unit
configuration gcc Debug build-gcc-debug none
configuration clang Debug build-clang-debug none
configuration clang RelWithDebInfo build-clang-relwithdebinfo none
current=""

echo
echo "==== all configurations passed (${SECONDS}s in all)"
printf '%s\n' "${timings[@]}"
