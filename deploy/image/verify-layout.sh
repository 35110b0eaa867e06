#!/usr/bin/env bash
# Checks an image payload tree against what the simulators expect.
#
#   verify-layout.sh ROOT
#
# ROOT is the payload directory at build time (or / inside the image):
#   usr/local/lib/mokka/nvidia-smi   executable, RUNPATH $ORIGIN/../lib64
#                                    (gpudriver --nvidia-smi-binary)
#   usr/local/lib/mokka/toolkit/     exactly nvidia-container-runtime,
#                                    nvidia-ctk, nvidia-cdi-hook, executable
#                                    (cri --toolkit-dir)
# Exits non-zero naming every deviation, so a build cannot ship a drifted
# layout.
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: verify-layout.sh ROOT" >&2; exit 2; }
root=${1%/}
problems=()

smi="$root/usr/local/lib/mokka/nvidia-smi"
if [ ! -f "$smi" ] || [ ! -x "$smi" ]; then
  problems+=("$smi: missing or not executable")
elif command -v patchelf >/dev/null; then
  rpath=$(patchelf --print-rpath "$smi" 2>/dev/null || true)
  # shellcheck disable=SC2016 # a literal $ORIGIN, expanded by the dynamic loader
  if [ "$rpath" != '$ORIGIN/../lib64' ]; then
    problems+=("$smi: RUNPATH '$rpath', expected '\$ORIGIN/../lib64'")
  fi
fi

toolkit="$root/usr/local/lib/mokka/toolkit"
expected="nvidia-cdi-hook nvidia-container-runtime nvidia-ctk"
if [ -d "$toolkit" ]; then
  actual=$(find "$toolkit" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ' | sed 's/ $//')
  if [ "$actual" != "$expected" ]; then
    problems+=("$toolkit: holds '$actual', expected exactly '$expected'")
  fi
  for bin in $expected; do
    if [ ! -f "$toolkit/$bin" ] || [ ! -x "$toolkit/$bin" ]; then
      problems+=("$toolkit/$bin: missing or not executable")
    fi
  done
else
  problems+=("$toolkit: missing")
fi

if [ ${#problems[@]} -gt 0 ]; then
  printf 'verify-layout.sh: %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "payload layout under $root is as the simulators expect"
