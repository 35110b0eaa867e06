#!/usr/bin/env bash
# Installs NVIDIA's real nvidia-smi into an image payload tree.
#
#   install-nvidia-smi.sh DESTDIR [DEB]
#
# Takes the binary (only the binary) from Debian's non-free `nvidia-smi`
# package: DEB when given, else `apt-get download nvidia-smi` (the caller
# enables non-free and runs `apt-get update`; NVIDIA_SMI_VERSION pins the
# Debian version).  The package's libnvidia-ml1 dependency is never
# installed: the mock NVML library is the one nvidia-smi must load.
#
# Result: DESTDIR/usr/local/lib/mokka/nvidia-smi, the gpudriver simulator's
# default --nvidia-smi-binary.  Its RUNPATH is set to $ORIGIN/../lib64: the
# simulator stages it as <driver root>/usr/bin/nvidia-smi, so its dlopen of
# libnvidia-ml.so.1 finds <driver root>/usr/lib64 without LD_LIBRARY_PATH.
set -euo pipefail

die() { echo "install-nvidia-smi.sh: $*" >&2; exit 1; }

if [ $# -lt 1 ] || [ $# -gt 2 ]; then die "usage: install-nvidia-smi.sh DESTDIR [DEB]"; fi
destdir=$1
deb=${2:-}
target="$destdir/usr/local/lib/mokka/nvidia-smi"
# shellcheck disable=SC2016 # a literal $ORIGIN, expanded by the dynamic loader
rpath='$ORIGIN/../lib64'

command -v patchelf >/dev/null || die "patchelf is required (Debian package patchelf)"
command -v dpkg-deb >/dev/null || die "dpkg-deb is required"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -z "$deb" ]; then
  (cd "$work" && apt-get download "nvidia-smi${NVIDIA_SMI_VERSION:+=$NVIDIA_SMI_VERSION}") \
    || die "apt-get download nvidia-smi failed: is Debian's non-free component enabled and 'apt-get update' done?"
  deb=$(echo "$work"/nvidia-smi_*.deb)
fi
[ -f "$deb" ] || die "$deb: no such .deb"
package=$(dpkg-deb -f "$deb" Package) || die "$deb: not a Debian package"
[ "$package" = nvidia-smi ] || die "$deb: package is '$package', expected nvidia-smi"
version=$(dpkg-deb -f "$deb" Version)

dpkg-deb -x "$deb" "$work/unpacked"
# Debian ships the binary under /usr/lib/nvidia/current (the alternatives
# system links /usr/bin/nvidia-smi to it); take the one regular file.
mapfile -t found < <(find "$work/unpacked" -type f -name nvidia-smi -perm -u+x)
[ ${#found[@]} -eq 1 ] || die "$deb: expected one nvidia-smi executable, found ${#found[@]}: ${found[*]:-none}"

install -D -m 0755 "${found[0]}" "$target"
patchelf --set-rpath "$rpath" "$target"
actual=$(patchelf --print-rpath "$target")
[ "$actual" = "$rpath" ] || die "$target: RUNPATH is '$actual' after patchelf, expected '$rpath'"
echo "installed nvidia-smi $version at $target (RUNPATH $rpath)"
