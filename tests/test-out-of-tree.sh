#!/usr/bin/env bash
# A plugin built outside the source tree, against the installed headers and
# pkg-config file only, loads and runs.
#   test-out-of-tree.sh SOURCE_ROOT BUILD_ROOT QKV_INFO [SANITIZERS]
# Installs the build into a temporary DESTDIR, points pkg-config at the qkv.pc
# there (relocated to the DESTDIR), then builds examples/plugins/gelu.c and a
# small program (tests/out-of-tree/consumer.c) with plain cc and
# `pkg-config --cflags --libs qkv`, and runs qkv-info --plugin and the program.
set -euo pipefail

src=$1
build=$2
qkv_info=$3
sanitize=${4:-none}

cc=${CC:-cc}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "SKIP: no C compiler ($cc)"
  exit 77
fi
if ! command -v pkg-config >/dev/null 2>&1; then
  echo "SKIP: no pkg-config"
  exit 77
fi
meson=${MESON:-meson}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qkv-out-of-tree.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "== meson install --destdir $tmp/root"
"$meson" install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }

pc=$(find "$tmp/root" -name qkv.pc -path '*/pkgconfig/*' | head -n 1)
if [ -z "$pc" ]; then
  echo "FAIL: meson install put no qkv.pc under $tmp/root"
  exit 1
fi
# The installed qkv.pc names the real prefix; relocate it into the DESTDIR.
prefix=$(sed -n 's/^prefix=//p' "$pc")
mkdir -p "$tmp/pkgconfig"
sed "s|^prefix=.*|prefix=$tmp/root$prefix|" "$pc" >"$tmp/pkgconfig/qkv.pc"
export PKG_CONFIG_PATH="$tmp/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

cflags=$(pkg-config --cflags qkv)
libs=$(pkg-config --libs qkv)
libdir=$(pkg-config --variable=libdir qkv)
plugindir=$(pkg-config --variable=plugindir qkv)
echo "pkg-config --cflags qkv: $cflags"
echo "pkg-config --libs qkv:   $libs"
echo "plugindir:               $plugindir"
case " $cflags " in
  *" -I$tmp/root"*) ;;
  *) echo "FAIL: the cflags do not point into the installed tree"; exit 1 ;;
esac
test -f "$tmp/root$prefix/include/qkv/qkv-plugin.h" ||
  { echo "FAIL: qkv-plugin.h is not installed"; exit 1; }

san=()
if [ "$sanitize" != none ] && [ -n "$sanitize" ]; then
  san=("-fsanitize=$sanitize")
fi

# Only the installed headers: no -I into the source tree.
echo "== cc -shared -fPIC gelu.c \$(pkg-config --cflags --libs qkv)"
"$cc" -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -Werror -shared -fPIC "${san[@]}" \
  -o "$tmp/gelu.so" "$src/examples/plugins/gelu.c" $cflags $libs -lm
echo "== cc consumer.c \$(pkg-config --cflags --libs qkv)"
"$cc" -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -Werror "${san[@]}" \
  -o "$tmp/consumer" "$src/tests/out-of-tree/consumer.c" $cflags $libs -lm

export QKV_PLUGIN_SYSTEM_PATH=
unset QKV_PLUGIN_PATH

echo "== qkv-info --plugin $tmp/gelu.so"
"$qkv_info" --plugin "$tmp/gelu.so" | tee "$tmp/info.txt"
grep -q "ops (2): example.gelu, example.gelu_backward" "$tmp/info.txt" ||
  { echo "FAIL: qkv-info did not report the plugin's ops"; exit 1; }

echo "== consumer (against the installed libqkv)"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/consumer" "$tmp/gelu.so"

# A plugin dropped into QKV_PLUGIN_PATH is found at initialisation.
mkdir -p "$tmp/plugins"
cp "$tmp/gelu.so" "$tmp/plugins/"
QKV_PLUGIN_PATH="$tmp/plugins" "$qkv_info" --op example.gelu | grep -q "example.gelu  \[$tmp/plugins/gelu.so\]" ||
  { echo "FAIL: QKV_PLUGIN_PATH did not load the plugin"; exit 1; }
echo "ok"
