#!/usr/bin/env bash
# Downloads the pinned NVIDIA Container Toolkit packages from NVIDIA's
# package repository, verified by apt against the repository's signing key.
#
#   fetch-toolkit.sh VERSION DEBDIR
#
# VERSION is the Debian version of both packages (e.g. 1.18.0-1).  apt runs
# with its own sources, lists and caches under a scratch directory, so the
# system's apt configuration is neither read nor changed.  The repository and
# key locations can be overridden (mirrors, tests):
#   TOOLKIT_REPO     apt source, default NVIDIA's stable repository
#   TOOLKIT_KEY_URL  ASCII-armoured signing key, default NVIDIA's
set -euo pipefail

die() { echo "fetch-toolkit.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: fetch-toolkit.sh VERSION DEBDIR"
version=$1
debdir=$2
repo=${TOOLKIT_REPO:-https://nvidia.github.io/libnvidia-container/stable/deb/\$(ARCH)}
key_url=${TOOLKIT_KEY_URL:-https://nvidia.github.io/libnvidia-container/gpgkey}
[ -n "$version" ] || die "empty VERSION: the toolkit is pinned by version"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/parts" "$debdir"

# apt reads an armoured key directly when the file ends in .asc.
curl -fsSL --retry 3 "$key_url" -o "$work/toolkit-keyring.asc" \
  || die "could not fetch the signing key from $key_url"
grep -q -- '-----BEGIN PGP PUBLIC KEY BLOCK-----' "$work/toolkit-keyring.asc" \
  || die "$key_url: not an ASCII-armoured PGP public key"
echo "deb [signed-by=$work/toolkit-keyring.asc] $repo /" > "$work/sources.list"

apt_opts=(
  -o "Dir::Etc::SourceList=$work/sources.list"
  -o "Dir::Etc::SourceParts=$work/parts"
  -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache::Archives=$work/archives"
  -o "Dir::Cache::pkgcache="
  -o "Dir::Cache::srcpkgcache="
  -o "Acquire::Retries=3"
  # The scratch directory is private to this user (mktemp), which apt's
  # unprivileged download user could not write; this runs in a build stage.
  -o "APT::Sandbox::User=root"
)
apt-get "${apt_opts[@]}" update \
  || die "apt-get update against $repo failed"
(cd "$debdir" && apt-get "${apt_opts[@]}" download \
  "nvidia-container-toolkit-base=$version" "nvidia-container-toolkit=$version") \
  || die "version $version of the toolkit packages is not in $repo"
echo "downloaded NVIDIA Container Toolkit $version into $debdir"
