#!/bin/sh
# tests/fuzz/run.sh SECONDS [TARGET...]
#
# Builds every tests/fuzz/fuzz-*.c (or the TARGETs named, as "fuzz-foo" or
# "foo") with clang, -fsanitize=fuzzer,address,undefined, linked with all of
# qkv's library sources compiled the same way, and runs each for SECONDS.
# Prints per target the executions and the crashes found; exits non-zero if
# any target crashed (or failed to build or run).
#
# Needs clang and libclang-rt-14-dev (Debian 12) besides qkv's own build
# dependencies (gcc builds the two SIMD kernel files). OpenMP is replaced by a single-thread shim (tests/fuzz/shim),
# so no libomp is needed and runs are deterministic.
#
# Seeds: tests/fuzz/corpus/<target>/ if it exists, plus, for a target whose
# source has the line "QKV_FUZZ_SEEDS: checkpoints", checkpoints that qkv
# saves (tests/fuzz/make-seeds.c) and the small .safetensors in tests/data.
#
# Environment: QKV_FUZZ_BUILD (build and working corpus directory, default
# build-fuzz at the root), QKV_FUZZ_JOBS (targets run at once, default 1),
# CC (default clang), QKV_FUZZ_ARGS (extra libFuzzer arguments).
set -eu

if [ $# -lt 1 ]; then
  echo "usage: $0 SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift

root=$(cd "$(dirname "$0")/../.." && pwd)
fuzzdir=$root/tests/fuzz
build=${QKV_FUZZ_BUILD:-$root/build-fuzz}
cc=${CC:-clang}
jobs=${QKV_FUZZ_JOBS:-1}
mkdir -p "$build/obj" "$build/bin"

version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" "$root/meson.build" | head -n 1)
pkgs="glib-2.0 gmodule-2.0 json-glib-1.0 sleef openblas"
# the flags go through a response file, so quoting survives xargs
rsp=$build/cflags.rsp
{
  echo "-std=c11 -g -O1 -fno-omit-frame-pointer -fno-math-errno -D_GNU_SOURCE"
  echo "'-DG_LOG_DOMAIN=\"qkv\"' '-DQKV_VERSION=\"$version\"' '-DQKV_PLUGIN_DIR=\"/nonexistent\"'"
  echo "-Wno-unknown-pragmas -Wno-unused-function"
  echo "-I$fuzzdir/shim -I$root/include -I$root/src -I$root/ops -I$root/graph $(pkg-config --cflags $pkgs)"
} >"$rsp.common"
{
  cat "$rsp.common"
  echo "-Wno-unused-command-line-argument"
  echo "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
} >"$rsp"
# Files that pick SIMD code with "#pragma GCC target" (clang ignores it) are
# built by gcc, uninstrumented: they hold the vector kernels, not parsers.
gcc_rsp=$build/gcc-cflags.rsp
cp "$rsp.common" "$gcc_rsp"
libs="$(pkg-config --libs $pkgs) -lm"

# 1. the library, compiled once per source change (any header change rebuilds all)
newest_header=$(ls -t "$root"/include/qkv/*.h "$root"/src/*/*.h "$root"/ops/*.h "$root"/graph/*/*.h \
  "$fuzzdir"/shim/*.h 2>/dev/null | head -n 1)
objs=""
stale=""
for src in "$root"/src/*.c "$root"/src/*/*.c "$root"/ops/*.c "$root"/graph/*/*.c; do
  rel=${src#"$root"/}
  # the fuzz targets do not use MPI: they link dist-none.c's qkv-dist.h,
  # not the MPI files beside it
  case $rel in
  src/dist/dist-none.c) ;;
  src/dist/*) continue ;;
  esac
  obj=$build/obj/$(echo "$rel" | tr / _).o
  objs="$objs $obj"
  if [ ! -e "$obj" ] || [ "$src" -nt "$obj" ] || [ "$newest_header" -nt "$obj" ]; then
    stale="$stale $src"
  fi
done
if [ -n "$stale" ]; then
  echo "run.sh: compiling $(echo $stale | wc -w) library sources"
  # shellcheck disable=SC2086
  printf '%s\n' $stale | xargs -P "$(nproc)" -I{} sh -c \
    'o=$(echo "${1#$2/}" | tr / _).o
     if grep -q "pragma GCC target" "$1"; then exec gcc @"$5" -c "$1" -o "$4/$o"; fi
     exec '"$cc"' @"$3" -fsanitize=fuzzer-no-link -c "$1" -o "$4/$o"' \
    sh {} "$root" "$rsp" "$build/obj" "$gcc_rsp"
fi

# 2. the targets
if [ $# -eq 0 ]; then
  set -- $(cd "$fuzzdir" && ls fuzz-*.c | sed 's/\.c$//')
fi
targets=""
for t in "$@"; do
  t=${t%.c}
  case $t in fuzz-*) ;; *) t=fuzz-$t ;; esac
  if [ ! -e "$fuzzdir/$t.c" ]; then
    echo "run.sh: no target $fuzzdir/$t.c" >&2
    exit 2
  fi
  # shellcheck disable=SC2086
  $cc @"$rsp" -fsanitize=fuzzer "$fuzzdir/$t.c" $objs $libs -o "$build/bin/$t"
  targets="$targets $t"
done

# 3. seeds
seeds=$build/seeds
rm -rf "$seeds"
mkdir -p "$seeds"
# shellcheck disable=SC2086
$cc @"$rsp" "$fuzzdir/make-seeds.c" $objs $libs -o "$build/bin/make-seeds"
QKV_PLUGIN_SYSTEM_PATH= ASAN_OPTIONS=detect_leaks=0 "$build/bin/make-seeds" "$seeds"
for f in "$root"/tests/data/*.safetensors; do
  if [ -e "$f" ] && [ "$(wc -c <"$f")" -le 65536 ]; then
    cp "$f" "$seeds/"
  fi
done

# 4. runs
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/.ci/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export QKV_PLUGIN_SYSTEM_PATH=

run_one() {
  t=$1
  corpus=$build/corpus/$t
  artifacts=$build/artifacts/$t
  mkdir -p "$corpus"
  rm -rf "$artifacts"
  mkdir -p "$artifacts"
  if [ -d "$fuzzdir/corpus/$t" ]; then
    cp "$fuzzdir/corpus/$t"/* "$corpus/" 2>/dev/null || true
  fi
  if grep -q "QKV_FUZZ_SEEDS: checkpoints" "$fuzzdir/$t.c"; then
    cp "$seeds"/* "$corpus/"
  fi
  rc=0
  # shellcheck disable=SC2086
  "$build/bin/$t" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$artifacts/" \
    ${QKV_FUZZ_ARGS:-} "$corpus" >"$build/$t.log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/$t.log" | tail -n 1)
  crashes=$(ls "$artifacts" | wc -l)
  echo "$t: $seconds s, ${execs:-?} execs, $crashes crashes, corpus $(ls "$corpus" | wc -l) files, exit $rc (log $build/$t.log)"
  if [ "$crashes" -gt 0 ]; then
    ls "$artifacts" | sed "s|^|  $artifacts/|"
    grep -m 3 -E "ERROR|runtime error|==ABORTING" "$build/$t.log" | sed 's/^/  /' || true
  fi
  [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]
}

status=0
running=0
pids=""
for t in $targets; do
  if [ "$jobs" -le 1 ]; then
    run_one "$t" || status=1
  else
    run_one "$t" >"$build/$t.summary" &
    pids="$pids $!:$t"
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      for p in $pids; do
        wait "${p%%:*}" || status=1
        cat "$build/${p#*:}.summary"
      done
      pids=""
      running=0
    fi
  fi
done
for p in $pids; do
  wait "${p%%:*}" || status=1
  cat "$build/${p#*:}.summary"
done
exit $status
