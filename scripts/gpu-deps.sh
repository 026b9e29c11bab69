#!/usr/bin/env bash
# Fills DIR (default .deps) on a Debian machine with anvil's dependencies (scripts/install-deps.sh
# installs them here first), as files, for a GPU machine where packages cannot be installed:
# the `cuda` preset (CMakePresets.json) finds each by its header and library under DIR
# (cmake/anvil_dependencies.cmake). Header-only libraries as headers; yaml-cpp and Chipmunk2D
# as static libraries; MuJoCo as its shared library and the four it loads (a program built
# against them runs with DIR/lib on LD_LIBRARY_PATH; scripts/gpu-check.sh sets it).
#
#   scripts/gpu-deps.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.deps}
lib=/usr/lib/x86_64-linux-gnu
mkdir -p "$dir/include/boost" "$dir/lib"
copy() {  # copy SRC... DEST, each SRC that exists
  local dest=${*: -1} src
  for src in "${@:1:$#-1}"; do
    if [[ -e $src ]]; then
      cp -rL "$src" "$dest"
    else
      echo "gpu-deps: $src not found (scripts/install-deps.sh installs it)" >&2
      return 1
    fi
  done
}
copy /usr/include/boost/pfr /usr/include/boost/pfr.hpp "$dir/include/boost/"
copy /usr/include/nlohmann /usr/include/yaml-cpp /usr/include/doctest "$dir/include/"
copy /usr/include/range /usr/include/meta /usr/include/concepts /usr/include/std "$dir/include/"
copy "$lib/libyaml-cpp.a" "$dir/lib/"
copy /usr/include/chipmunk "$dir/include/" && copy "$lib/libchipmunk.a" "$dir/lib/"
# MuJoCo (optional): its headers, libmujoco and what it loads (ldd names them)
if [[ -f $lib/libmujoco.so ]]; then
  copy /usr/include/mujoco "$dir/include/"
  real=$(readlink -f "$lib/libmujoco.so")
  cp "$real" "$dir/lib/" && ln -sf "$(basename "$real")" "$dir/lib/libmujoco.so"
  soname=$(objdump -p "$real" | awk '/SONAME/ {print $2}')
  [[ -z $soname || -e $dir/lib/$soname ]] || ln -sf "$(basename "$real")" "$dir/lib/$soname"
  ldd "$real" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case $name in libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*) continue ;; esac
    cp -L "$path" "$dir/lib/$name"
  done
fi
echo "gpu-deps: $(du -sh "$dir" | cut -f1) in $dir"
