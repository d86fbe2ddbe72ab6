#!/usr/bin/env bash
# KAFKA_* env vars -> server.properties (apache/kafka's rule: KAFKA_FOO_BAR -> foo.bar, `__` -> `_`,
# `___` -> `-`), format the KRaft storage with CLUSTER_ID the first time, then run the broker.
set -euo pipefail
PROPS=/opt/kafka/config/server.properties
: >"$PROPS"
while IFS='=' read -r name value; do
    case "$name" in
        KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS) continue ;;
        KAFKA_*) ;;
        *) continue ;;
    esac
    key="${name#KAFKA_}"
    key="$(echo "$key" | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g' | tr '[:upper:]' '[:lower:]')"
    echo "$key=$value" >>"$PROPS"
done < <(env)
CP='/opt/kafka/libs/*'
LOG_DIRS="$(sed -n 's/^log\.dirs=//p' "$PROPS")"
if [ ! -f "${LOG_DIRS%%,*}/meta.properties" ]; then
    java -cp "$CP" kafka.tools.StorageTool format --ignore-formatted -t "${CLUSTER_ID:?set CLUSTER_ID}" -c "$PROPS"
fi
# shellcheck disable=SC2086  # the heap options are several words
exec java ${KAFKA_HEAP_OPTS:--Xmx1g -Xms512m} ${KAFKA_OPTS:-} -cp "$CP" kafka.Kafka "$PROPS"
