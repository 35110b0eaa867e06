#!/usr/bin/env bash
# Installs Debian's real InfiniBand tools, with their library closure, into an
# image payload tree.
#
#   install-ib-tools.sh DESTDIR [DEBDIR]
#
# Takes `ibstat` and `ibstatus` (infiniband-diags) and `ibv_devinfo` and
# `ibv_devices` (ibverbs-utils), which read the mock sysfs tree, and the
# twelve infiniband-diags tools that send management datagrams to the
# mock-ib daemon (`sminfo`, `smpquery`, `perfquery`, `ibping`,
# `ibnetdiscover`, `iblinkinfo`, `ibaddr`, `ibtracert`, `ibqueryerrors`,
# `ibroute`, `ibportstate`, `ibsysstat`: the ib simulator's MAD_TOOLS), with
# the libraries they link (libibmad5, libibumad3, libibnetdisc5, libibverbs1
# and libibverbs1's libnl-3-200, libnl-route-3-200) from the Debian packages:
# the .debs in DEBDIR when given, else `apt-get download` (the caller runs
# `apt-get update`; RDMA_CORE_VERSION pins the version of the rdma-core
# packages).  Nothing is installed with dpkg: each package is unpacked with
# `dpkg-deb -x`.
#
# Result, under DESTDIR/usr/local/lib/mokka/ib (the ib simulator's default
# --ib-tools-dir):
#   bin/<tool>                                      0755, RUNPATH $ORIGIN/../lib
#   lib/<soname>                                    0644, RUNPATH $ORIGIN
#   share/doc/<package>/copyright                   the packages' licences
# lib/ holds exactly the non-glibc closure of the binaries' DT_NEEDED
# entries, resolved against the unpacked packages, one regular file per
# soname.  glibc (libc, libm, ld-linux, ...) is never copied: every node has
# it, and a second copy would not match the node's dynamic loader.  The
# simulator stages bin/ and lib/ as siblings inside the driver tree, so the
# relative RUNPATHs hold there too: the tools run on nodes without
# infiniband-diags or ibverbs-utils, and ignore the node's own copies.
#
# No verbs provider (ibverbs-providers) is shipped: the tools run under the
# verbs shim, which answers every device call from the mock tree.
set -euo pipefail

die() { echo "install-ib-tools.sh: $*" >&2; exit 1; }

if [ $# -lt 1 ] || [ $# -gt 2 ]; then die "usage: install-ib-tools.sh DESTDIR [DEBDIR]"; fi
destdir=$1
debdir=${2:-}
target="$destdir/usr/local/lib/mokka/ib"
# shellcheck disable=SC2016 # literal $ORIGIN, expanded by the dynamic loader
bin_rpath='$ORIGIN/../lib'
# shellcheck disable=SC2016
lib_rpath='$ORIGIN'

# The packages of rdma-core (one source, one version) and of libnl3.
rdma_packages=(infiniband-diags ibverbs-utils libibumad3 libibmad5 libibnetdisc5 libibverbs1)
other_packages=(libnl-3-200 libnl-route-3-200)
packages=("${rdma_packages[@]}" "${other_packages[@]}")
# The sysfs readers, then the MAD tools (keep in step with the ib simulator's
# SYSFS_TOOLS, FULL_TOOLS and MAD_TOOLS: the wrappers run the image's copies
# of the MAD tools only when the bundle has every one of them).
tools=(ibstat ibstatus ibv_devinfo ibv_devices
       sminfo smpquery perfquery ibping ibnetdiscover iblinkinfo
       ibaddr ibtracert ibqueryerrors ibroute ibportstate ibsysstat)
# Sonames glibc (Debian libc6) provides: the node's own, never copied.
glibc='^(libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnsl\.so\.1|libBrokenLocale\.so\.1|libthread_db\.so\.1|libnss_[a-z0-9_]+\.so\.2|ld-linux[-a-z0-9_.]*\.so\.[0-9]+|ld64\.so\.[0-9]+)$'

command -v patchelf >/dev/null || die "patchelf is required (Debian package patchelf)"
command -v dpkg-deb >/dev/null || die "dpkg-deb is required"
arch=$(dpkg --print-architecture) || die "dpkg --print-architecture failed"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -z "$debdir" ]; then
  debdir="$work/debs"
  mkdir "$debdir"
  pinned=()
  for p in "${rdma_packages[@]}"; do pinned+=("$p${RDMA_CORE_VERSION:+=$RDMA_CORE_VERSION}"); done
  (cd "$debdir" && apt-get download "${pinned[@]}" "${other_packages[@]}") \
    || die "apt-get download ${packages[*]} failed: is 'apt-get update' done?"
fi
[ -d "$debdir" ] || die "$debdir: no such directory"

# One .deb per package, for this architecture, found by its control fields
# (file names are not trusted).
declare -A deb_of version_of
shopt -s nullglob
for deb in "$debdir"/*.deb; do
  package=$(dpkg-deb -f "$deb" Package) || die "$deb: not a Debian package"
  for wanted in "${packages[@]}"; do
    [ "$package" = "$wanted" ] || continue
    [ -z "${deb_of[$package]:-}" ] \
      || die "$debdir: more than one $package .deb (${deb_of[$package]}, $deb)"
    deb_arch=$(dpkg-deb -f "$deb" Architecture)
    [ "$deb_arch" = "$arch" ] || die "$deb: architecture $deb_arch, expected $arch"
    deb_of[$package]=$deb
    version_of[$package]=$(dpkg-deb -f "$deb" Version)
  done
done
shopt -u nullglob
for p in "${packages[@]}"; do
  [ -n "${deb_of[$p]:-}" ] || die "$debdir: no $p .deb (needed: ${packages[*]})"
done
# rdma-core's packages only work with each other at one version.
rdma_version=${version_of[infiniband-diags]}
for p in "${rdma_packages[@]}"; do
  [ "${version_of[$p]}" = "$rdma_version" ] \
    || die "$p is ${version_of[$p]} but infiniband-diags is $rdma_version: rdma-core packages must share one version"
done
if [ -n "${RDMA_CORE_VERSION:-}" ] && [ "$rdma_version" != "$RDMA_CORE_VERSION" ]; then
  die "rdma-core packages are version $rdma_version, expected the pinned $RDMA_CORE_VERSION"
fi

unpacked="$work/unpacked"
for p in "${packages[@]}"; do
  dpkg-deb -x "${deb_of[$p]}" "$unpacked" || die "${deb_of[$p]}: dpkg-deb -x failed"
done

out="$work/out"
mkdir -p "$out/bin" "$out/lib"

is_elf() { [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }

# The tools: regular executable files in the packages' bin directories.
elves=()
for tool in "${tools[@]}"; do
  found=
  for dir in usr/sbin usr/bin sbin bin; do
    candidate="$unpacked/$dir/$tool"
    if [ -f "$candidate" ] && [ ! -L "$candidate" ] && [ -x "$candidate" ]; then
      found=$candidate
      break
    fi
  done
  [ -n "$found" ] || die "no executable $tool in the unpacked packages (${packages[*]})"
  install -m 0755 "$found" "$out/bin/$tool"
  # ibstatus is a shell script (it only cats sysfs); the rest are ELF.
  if is_elf "$out/bin/$tool"; then elves+=("$out/bin/$tool"); fi
done

# The library closure: DT_NEEDED recursion, each soname resolved in the
# unpacked packages' library directories (libraries only, not plugins).
find_library() {
  local name=$1 dir
  for dir in "$unpacked"/usr/lib/*-linux-gnu* "$unpacked"/lib/*-linux-gnu* \
             "$unpacked/usr/lib" "$unpacked/lib"; do
    if [ -e "$dir/$name" ]; then echo "$dir/$name"; return 0; fi
  done
  return 1
}
queue=("${elves[@]}")
libraries=()
while [ ${#queue[@]} -gt 0 ]; do
  object=${queue[0]}
  queue=("${queue[@]:1}")
  needed=$(patchelf --print-needed "$object") || die "$object: patchelf --print-needed failed"
  for name in $needed; do
    if [[ $name =~ $glibc ]]; then continue; fi
    [ -e "$out/lib/$name" ] && continue
    source=$(find_library "$name") \
      || die "$(basename "$object") needs $name, which none of ${packages[*]} provides (only glibc is taken from the node)"
    # -L: the soname is a link to the versioned file; ship one regular file.
    cp -L "$source" "$out/lib/$name"
    chmod 0644 "$out/lib/$name"
    libraries+=("$name")
    queue+=("$out/lib/$name")
  done
done

for elf in "${elves[@]}"; do
  patchelf --set-rpath "$bin_rpath" "$elf"
  actual=$(patchelf --print-rpath "$elf")
  [ "$actual" = "$bin_rpath" ] || die "$elf: RUNPATH is '$actual' after patchelf, expected '$bin_rpath'"
done
for name in "${libraries[@]}"; do
  patchelf --set-rpath "$lib_rpath" "$out/lib/$name"
  actual=$(patchelf --print-rpath "$out/lib/$name")
  [ "$actual" = "$lib_rpath" ] || die "$name: RUNPATH is '$actual' after patchelf, expected '$lib_rpath'"
done

# The licences travel with the binaries (libnl is LGPL, rdma-core GPL/BSD).
for p in "${packages[@]}"; do
  copyright="$unpacked/usr/share/doc/$p/copyright"
  [ -f "$copyright" ] || die "${deb_of[$p]}: no usr/share/doc/$p/copyright"
  install -D -m 0644 "$copyright" "$out/share/doc/$p/copyright"
done

# Replace, never merge: a library an older build needed must not linger.
rm -rf "$target"
mkdir -p "$(dirname "$target")"
cp -a "$out" "$target"
chmod 0755 "$target"
echo "installed ${tools[*]} (rdma-core $rdma_version) with ${#libraries[@]} libraries (${libraries[*]}) at $target"
