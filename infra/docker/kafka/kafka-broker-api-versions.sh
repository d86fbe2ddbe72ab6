#!/usr/bin/env bash
# The health check apache/kafka's image answers: exit 0 when the broker at --bootstrap-server answers a
# metadata request (Kafka's Admin client, HealthCheck.java), 1 otherwise.
set -euo pipefail
server=localhost:9092
while [ "$#" -gt 0 ]; do
    case "$1" in
        --bootstrap-server) server="$2"; shift 2 ;;
        *) shift ;;
    esac
done
exec java -Xmx64m -cp "/opt/kafka/bin:/opt/kafka/libs/*" HealthCheck "$server"
