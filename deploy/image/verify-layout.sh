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
#   usr/local/lib/mokka/ib/bin/      exactly ibstat, ibstatus, ibv_devices,
#                                    ibv_devinfo and the twelve MAD tools
#                                    (sminfo ... ibsysstat), executable; the
#                                    ELF ones RUNPATH $ORIGIN/../lib
#                                    (ib --ib-tools-dir)
#   usr/local/lib/mokka/ib/lib/      their non-glibc library closure, RUNPATH
#                                    $ORIGIN: every DT_NEEDED of a tool or
#                                    library is glibc or a file here, and no
#                                    glibc library is here
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

ib="$root/usr/local/lib/mokka/ib"
# In C collation order (what the listing below is compared with).
ib_tools="ibaddr iblinkinfo ibnetdiscover ibping ibportstate ibqueryerrors ibroute ibstat ibstatus ibsysstat ibtracert ibv_devices ibv_devinfo perfquery sminfo smpquery"
# Sonames glibc provides (the node's own; install-ib-tools.sh never copies them).
glibc='^(libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnsl\.so\.1|libBrokenLocale\.so\.1|libthread_db\.so\.1|libnss_[a-z0-9_]+\.so\.2|ld-linux[-a-z0-9_.]*\.so\.[0-9]+|ld64\.so\.[0-9]+)$'
is_elf() { [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }
# Checks one ELF's RUNPATH and that each DT_NEEDED is glibc or in lib/.
check_elf() {
  local elf=$1 expected=$2 rpath needed name
  rpath=$(patchelf --print-rpath "$elf" 2>/dev/null || true)
  if [ "$rpath" != "$expected" ]; then
    problems+=("$elf: RUNPATH '$rpath', expected '$expected'")
  fi
  needed=$(patchelf --print-needed "$elf" 2>/dev/null || true)
  for name in $needed; do
    if ! [[ $name =~ $glibc ]] && [ ! -f "$ib/lib/$name" ]; then
      problems+=("$elf: needs $name, which is not in $ib/lib")
    fi
  done
}
if [ -d "$ib/bin" ] && [ -d "$ib/lib" ]; then
  actual=$(find "$ib/bin" -mindepth 1 -maxdepth 1 -printf '%f\n' | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//')
  if [ "$actual" != "$ib_tools" ]; then
    problems+=("$ib/bin: holds '$actual', expected exactly '$ib_tools'")
  fi
  for tool in $ib_tools; do
    if [ ! -f "$ib/bin/$tool" ] || [ ! -x "$ib/bin/$tool" ]; then
      problems+=("$ib/bin/$tool: missing or not executable")
    elif [ "$tool" != ibstatus ] && command -v patchelf >/dev/null; then
      # shellcheck disable=SC2016 # a literal $ORIGIN, expanded by the dynamic loader
      check_elf "$ib/bin/$tool" '$ORIGIN/../lib'
    fi
  done
  libraries=0
  for lib in "$ib/lib"/*; do
    [ -e "$lib" ] || continue
    libraries=$((libraries + 1))
    name=$(basename "$lib")
    if [[ $name =~ $glibc ]]; then
      problems+=("$lib: a glibc library, which must come from the node")
    elif [ ! -f "$lib" ] || ! is_elf "$lib"; then
      problems+=("$lib: not a shared library")
    elif command -v patchelf >/dev/null; then
      # shellcheck disable=SC2016
      check_elf "$lib" '$ORIGIN'
    fi
  done
  [ "$libraries" -gt 0 ] || problems+=("$ib/lib: empty, expected the tools' libraries")
else
  problems+=("$ib: missing bin/ or lib/")
fi

if [ ${#problems[@]} -gt 0 ]; then
  printf 'verify-layout.sh: %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "payload layout under $root is as the simulators expect"
