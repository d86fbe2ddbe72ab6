#!/usr/bin/env bash
# A Debian bookworm base image from the Debian mirror, for machines that reach no image registry.
#
#   bash infra/scripts/base_image.sh [TAG]      # default flywheel-base:bookworm; prints the tag
#
# `debootstrap --variant=minbase bookworm` into a scratch directory, packed once into
# ~/.cache/flywheel/docker/bookworm-minbase.tar (FLYWHEEL_DOCKER_ROOT), then `docker import`. Nothing
# happens when the image is already there. The Dockerfiles take it as their BASE build argument
# (infra/docker/Dockerfile, infra/docker/kafka/Dockerfile); with a registry they use the public images.
set -euo pipefail

TAG="${1:-flywheel-base:bookworm}"
ROOT="${FLYWHEEL_DOCKER_ROOT:-$HOME/.cache/flywheel/docker}"
TARBALL="$ROOT/bookworm-minbase.tar"
MIRROR="${FLYWHEEL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DOCKER="${DOCKER:-/usr/bin/docker}"

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG"
    exit 0
fi
if [ ! -s "$TARBALL" ]; then
    mkdir -p "$ROOT"
    scratch="$(mktemp -d "$ROOT/debootstrap.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    debootstrap --variant=minbase bookworm "$scratch/rootfs" "$MIRROR" >"$scratch/debootstrap.log" 2>&1 || {
        tail -n 20 "$scratch/debootstrap.log" >&2
        exit 1
    }
    # no package lists or caches in the image; apt-get update runs in the Dockerfiles
    rm -rf "$scratch/rootfs/var/lib/apt/lists/"* "$scratch/rootfs/var/cache/apt/archives/"*.deb
    tar -C "$scratch/rootfs" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
fi
"$DOCKER" import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$TARBALL" "$TAG" >/dev/null
echo "$TAG"
