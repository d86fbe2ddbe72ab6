"""Shared fixtures. Kafka fixtures live in tests/kafka_fixtures.py (registered below)."""

pytest_plugins = ["tests.kafka_fixtures"]
