#!/usr/bin/env bash
# Installs the NVIDIA Container Toolkit binaries into an image payload tree.
#
#   install-toolkit.sh DESTDIR DEBDIR [VERSION]
#
# DEBDIR holds exactly one nvidia-container-toolkit-base and one
# nvidia-container-toolkit .deb of the same version (fetch-toolkit.sh
# downloads them); VERSION (or NVIDIA_CONTAINER_TOOLKIT_VERSION), when given,
# must be that version.  The packages are unpacked, never installed, and
# nvidia-container-runtime, nvidia-ctk and nvidia-cdi-hook are copied to
# DESTDIR/usr/local/lib/mokka/toolkit/, the cri simulator's default
# --toolkit-dir.  Nothing else goes there: the simulator installs every
# regular file in that directory on the node.
set -euo pipefail

die() { echo "install-toolkit.sh: $*" >&2; exit 1; }

if [ $# -lt 2 ] || [ $# -gt 3 ]; then die "usage: install-toolkit.sh DESTDIR DEBDIR [VERSION]"; fi
destdir=$1
debdir=$2
pin=${3:-${NVIDIA_CONTAINER_TOOLKIT_VERSION:-}}
target="$destdir/usr/local/lib/mokka/toolkit"
binaries=(nvidia-container-runtime nvidia-ctk nvidia-cdi-hook)
packages=(nvidia-container-toolkit-base nvidia-container-toolkit)

[ -d "$debdir" ] || die "$debdir: no such directory"
arch=${TOOLKIT_ARCH:-$(dpkg --print-architecture)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Find each package by its control data, not its file name.
declare -A deb_of=()
for deb in "$debdir"/*.deb; do
  [ -f "$deb" ] || continue
  name=$(dpkg-deb -f "$deb" Package) || die "$deb: not a Debian package"
  for wanted in "${packages[@]}"; do
    if [ "$name" = "$wanted" ]; then
      [ -z "${deb_of[$name]:-}" ] || die "$debdir: more than one $name package: ${deb_of[$name]} and $deb"
      deb_of[$name]=$deb
    fi
  done
done

version=
for name in "${packages[@]}"; do
  deb=${deb_of[$name]:-}
  [ -n "$deb" ] || die "$debdir: no $name .deb"
  v=$(dpkg-deb -f "$deb" Version)
  a=$(dpkg-deb -f "$deb" Architecture)
  [ "$a" = "$arch" ] || die "$deb: architecture $a, expected $arch"
  [ -z "$pin" ] || [ "$v" = "$pin" ] || die "$deb: version $v, expected the pinned $pin"
  [ -z "$version" ] || [ "$v" = "$version" ] || die "$debdir: $name is $v but the other package is $version"
  version=$v
  dpkg-deb -x "$deb" "$work/unpacked"
done

# Check all before copying any, so a refusal leaves no partial payload.
for bin in "${binaries[@]}"; do
  src="$work/unpacked/usr/bin/$bin"
  if [ ! -f "$src" ] || [ -L "$src" ] || [ ! -x "$src" ]; then
    die "$debdir: no executable usr/bin/$bin in the ${packages[*]} packages $version"
  fi
done
install -d -m 0755 "$target"
for bin in "${binaries[@]}"; do
  install -m 0755 "$work/unpacked/usr/bin/$bin" "$target/$bin"
done
echo "installed NVIDIA Container Toolkit $version ($arch) at $target: ${binaries[*]}"
