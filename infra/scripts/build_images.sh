#!/usr/bin/env bash
# The images the compose stack's cpu profile needs, built from packages (no image registry needed):
#
#   bash infra/scripts/build_images.sh        # prints FLYWHEEL_IMAGE=..., FLYWHEEL_KAFKA_IMAGE=... lines
#
# 1. flywheel-base:bookworm: debootstrap's minimal bookworm (infra/scripts/base_image.sh).
# 2. flywheel-train:latest: infra/docker/Dockerfile, target `train`, BASE=flywheel-base:bookworm (Debian's
#    Python 3.11, uv and the locked dependencies from PyPI). One image serves every Flywheel service of
#    the stack: the `service` target would be a second copy of the same dependencies minus torch.
# 3. flywheel-kafka:<version>: infra/docker/kafka/Dockerfile, Debian's OpenJDK 17 and the Kafka jars
#    `flywheel kafka start` fetches (~/.cache/flywheel/kafka/<version>/libs).
#
# With a registry, `docker compose build` builds the same Dockerfiles from python:3.11-slim and
# compose runs apache/kafka. Layers live in the daemon's data root: a rebuild with an unchanged
# uv.lock reuses the dependency layer, and only the source layers run again.
set -euo pipefail
cd "$(dirname "$0")/../.."

DOCKER="${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}"
export DOCKER DOCKER_BUILDKIT=1
PY="${FLYWHEEL_PYTHON:-${UV_PROJECT_ENVIRONMENT:-$HOME/.cache/flywheel/venv}/bin/python}"
BASE="$(bash infra/scripts/base_image.sh)"
IMAGE="${FLYWHEEL_IMAGE:-flywheel-train:latest}"

# the host's CA bundle, for PyPI behind a TLS-intercepting proxy (a build secret: in no layer)
CA="${FLYWHEEL_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
secret=()
[ -s "$CA" ] && secret=(--secret "id=ca_bundle,src=$CA")
"$DOCKER" build -q "${secret[@]}" -f infra/docker/Dockerfile --target train --build-arg "BASE=$BASE" -t "$IMAGE" . \
    >/dev/null

LIBS="$(PYTHONPATH="$PWD" "$PY" -c 'from infra.kafka.launcher import ensure_jars; print(ensure_jars())')"
VERSION="$(basename "$(dirname "$LIBS")")"
KAFKA_IMAGE="${FLYWHEEL_KAFKA_IMAGE:-flywheel-kafka:$VERSION}"
context="$(mktemp -d "${TMPDIR:-/tmp}/flywheel-kafka-image.XXXXXX")"
trap 'rm -rf "$context"' EXIT
cp infra/docker/kafka/* "$context/"
cp -r "$LIBS" "$context/libs"
"$DOCKER" build -q --build-arg "BASE=$BASE" -t "$KAFKA_IMAGE" "$context" >/dev/null

echo "FLYWHEEL_IMAGE=$IMAGE"
echo "FLYWHEEL_TRAIN_IMAGE=$IMAGE"
echo "FLYWHEEL_KAFKA_IMAGE=$KAFKA_IMAGE"
