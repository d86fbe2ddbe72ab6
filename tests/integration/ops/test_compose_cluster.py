"""infra/docker-compose.cluster.yml over docker-compose.yml: three KRaft brokers (RF=3, min ISR 2) and two
gateways (one address), workers and reward services; validated with ``docker-compose config``, not run."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.integration.ops.deploy_tools import COMPOSE_FILE, compose_config

pytestmark = pytest.mark.timeout(60)

CLUSTER_FILE = COMPOSE_FILE.with_name("docker-compose.cluster.yml")
BROKERS = ("kafka", "kafka-2", "kafka-3")
BOOTSTRAP = "kafka:9092,kafka-2:9092,kafka-3:9092"
PAIRS = (("gateway", "gateway-2"), ("worker", "worker-2"), ("reward", "reward-2"))


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def services(request: pytest.FixtureRequest) -> dict[str, Any]:
    result = compose_config(
        "-f", str(CLUSTER_FILE), "--profile", request.param, env={"FLYWHEEL_ADMIN_TOKEN": "s3cret-test-token"}
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = yaml.safe_load(result.stdout)["services"]
    return loaded


def test_three_brokers_vote_in_one_quorum_with_rf3_and_min_isr_2(services: dict[str, Any]) -> None:
    envs = [services[name]["environment"] for name in BROKERS]
    assert [str(env["KAFKA_NODE_ID"]) for env in envs] == ["1", "2", "3"]
    assert {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs} == {
        "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
    }
    assert len({env["CLUSTER_ID"] for env in envs}) == 1
    for name, env in zip(BROKERS, envs, strict=True):
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert str(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == "3"
        assert str(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == "3"
        assert str(env["KAFKA_MIN_INSYNC_REPLICAS"]) == "2"
        assert services[name]["healthcheck"]["test"]
    volumes = [str(services[name]["volumes"][0]) for name in BROKERS]
    assert len({v.split(":")[0] for v in volumes}) == 3  # one data volume each


def test_every_flywheel_service_bootstraps_from_all_three_brokers(services: dict[str, Any]) -> None:
    flywheel = [name for name, svc in services.items() if "FLYWHEEL_BUS" in svc.get("environment", {})]
    assert {"topics", "gateway", "gateway-2", "worker-2", "reward-2"} <= set(flywheel)
    assert {name: services[name]["environment"]["FLYWHEEL_KAFKA_BOOTSTRAP"] for name in flywheel} == {
        name: BOOTSTRAP for name in flywheel
    }
    assert set(services["topics"]["depends_on"]) >= set(BROKERS)  # RF=3 topics need all three


def test_the_second_replicas_match_the_first(services: dict[str, Any]) -> None:
    """The second of each is written out in the overlay: it must stay what the first is."""
    for first, second in PAIRS:
        a, b = services[first], services[second]
        assert a["environment"] == b["environment"], second
        assert (a["command"], a["image"], a["healthcheck"]) == (b["command"], b["image"], b["healthcheck"])
        assert a["depends_on"] == b["depends_on"], second


def test_two_gateways_answer_as_one_address_with_their_own_spools(services: dict[str, Any]) -> None:
    assert services["gateway-2"]["networks"]["default"]["aliases"] == ["gateway"]
    assert "ports" not in services["gateway-2"]  # only the first publishes 8100 on the host
    spools = [str(services[name]["volumes"][0]).split(":")[0] for name in ("gateway", "gateway-2")]
    assert spools[0] != spools[1]
    assert services["worker-2"]["environment"]["FLYWHEEL_GATEWAY_URL"] == "http://gateway:8100"
