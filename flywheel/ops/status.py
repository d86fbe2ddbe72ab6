"""``flywheel status``: services, consumer-group lag per topic, gateway state, weights and trainer step.

The same report comes from two places: the CLI builds it against Kafka (lag through the bus, live
consumers through Kafka's group coordinator, weights and trainer step from the control topic), and a
running embedded stack builds it in-process and serves it on its admin API (``flywheel up``), since
the in-process bus cannot be seen from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsRequest_v3,
    DescribeGroupsResponse_v3,
)

from infra.bus.base import Bus, BusError, Message
from schemas import (
    CONTROL,
    DEADLETTER,
    EPISODES,
    TASKS,
    TRANSITIONS,
    InferenceDrained,
    TrainerPauseRequested,
    TrainerResumeRequested,
    TrainerStepCompleted,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)

# Consumer groups of the services (their settings' defaults), per topic they consume.
SERVICE_GROUPS: Mapping[str, str] = {
    "rollout-workers": "worker",
    "reward-service": "reward",
    "trainer": "trainer",
    "recorder": "recorder",
}
TOPIC_GROUPS: Mapping[str, tuple[str, ...]] = {
    TASKS: ("rollout-workers", "recorder"),
    EPISODES: ("reward-service", "recorder"),
    TRANSITIONS: ("trainer", "recorder"),
    CONTROL: ("recorder",),
    DEADLETTER: ("recorder",),
}


@dataclass
class ControlState:
    """What the control topic says about the policy: latest weights, pending update, trainer step."""

    weight_version: int | None = None
    pending_version: int | None = None
    trainer_step: int | None = None
    trainer_version: int | None = None
    trainer_metrics: dict[str, float] = field(default_factory=dict)
    trainer_pause: str | None = None  # the reason of the last pause request not followed by a resume
    last_failure: str | None = None
    drained_gateways: set[str] = field(default_factory=set)
    events: int = 0

    def apply(self, event: object) -> None:
        self.events += 1
        match event:
            case WeightUpdateRequested(version=v):
                self.pending_version = v
                self.drained_gateways = set()
            case InferenceDrained(gateway_id=g):
                self.drained_gateways.add(g)
            case WeightsActivated(version=v):
                self.weight_version = v
                if self.pending_version is not None and self.pending_version <= v:
                    self.pending_version = None
            case WeightUpdateFailed(version=v, serving_version=serving, error=error):
                self.weight_version = serving
                self.last_failure = f"v{v}: {error}"
                self.pending_version = None
            case TrainerStepCompleted(step=step, version=v, metrics=metrics):
                self.trainer_step, self.trainer_version, self.trainer_metrics = step, v, metrics.as_dict()
            case TrainerPauseRequested(reason=reason):
                self.trainer_pause = reason or "paused"
            case TrainerResumeRequested():
                self.trainer_pause = None

    async def handle(self, message: Message) -> None:
        self.apply(message.event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "weight_version": self.weight_version,
            "pending_version": self.pending_version,
            "trainer_step": self.trainer_step,
            "trainer_version": self.trainer_version,
            "trainer_metrics": self.trainer_metrics,
            "trainer_pause_requested": self.trainer_pause,
            "last_failure": self.last_failure,
            "control_events": self.events,
        }


async def read_control(bus: Bus, *, timeout_s: float = 5.0) -> ControlState:
    """Read the control topic from the beginning with a throwaway group until caught up (or timeout)."""
    state = ControlState()
    group = f"flywheel-status-{uuid.uuid4().hex[:12]}"
    await bus.ensure_topics([CONTROL])
    sub = await bus.subscribe(CONTROL, group, state.handle, from_beginning=True)
    try:
        async with asyncio.timeout(timeout_s):
            # Offsets live in the broker: there is no event for "caught up", so poll the group's lag.
            while await bus.lag(CONTROL, group) > 0:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    except TimeoutError:
        pass  # report what was read; a huge control topic is not a reason to hang
    finally:
        await sub.stop()
    return state


async def topic_lags(
    bus: Bus, topic_groups: Mapping[str, Sequence[str]] = TOPIC_GROUPS
) -> dict[str, dict[str, int]]:
    """Lag of each service group on each existing topic: ``{topic: {group: lag}}``."""
    existing = set(await bus.list_topics())
    out: dict[str, dict[str, int]] = {}
    for topic in sorted(existing):
        base = TASKS if topic.startswith(TASKS + ".") else topic
        out[topic] = {g: await bus.lag(topic, g) for g in topic_groups.get(base, ())}
    return out


class _DescribeGroupsV3(DescribeGroupsRequest_v3):  # type: ignore[misc]
    RESPONSE_TYPE = DescribeGroupsResponse_v3


class _DescribeGroups(DescribeGroupsRequest):  # type: ignore[misc]
    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION == 3:
            request_struct_class = _DescribeGroupsV3
        return super().build(request_struct_class)


def _describe_groups_request(groups: list[str]) -> Any:
    """A DescribeGroups request that decodes on Kafka 4.x.

    aiokafka 0.14 pairs DescribeGroups request v3 with the v2 response schema, so the v3 answer
    (which adds ``authorized_operations``) fails to decode ("Buffer underrun"); this pairs v3 with
    the v3 response.
    """
    return _DescribeGroups(groups)


async def kafka_group_members(
    bootstrap: str, prefix: str, groups: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``{group: {"state": ..., "members": n}}`` from Kafka's group coordinator."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    out: dict[str, dict[str, Any]] = {}
    try:
        for group in groups:
            node = await admin.find_coordinator(prefix + group)
            response = await admin._client.send(node, _describe_groups_request([prefix + group]))
            for entry in response.groups:
                name, state, members = entry[1], entry[2], entry[5]
                out[name.removeprefix(prefix)] = {"state": state or "Dead", "members": len(members)}
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    return out


@dataclass
class StatusReport:
    runtime: str
    bus: str
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    topics: dict[str, dict[str, int]] = field(default_factory=dict)
    gateway: dict[str, Any] | None = None
    control: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "bus": self.bus,
            "services": self.services,
            "topics": self.topics,
            "gateway": self.gateway,
            "control": self.control,
            "problems": self.problems,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StatusReport:
        return cls(
            runtime=str(data.get("runtime", "?")),
            bus=str(data.get("bus", "?")),
            services=dict(data.get("services") or {}),
            topics=dict(data.get("topics") or {}),
            gateway=data.get("gateway"),
            control=dict(data.get("control") or {}),
            problems=list(data.get("problems") or []),
        )


async def kafka_status(bus: Bus, bootstrap: str, prefix: str, *, timeout_s: float = 5.0) -> StatusReport:
    """The report for a distributed deployment (the bus must be a started Kafka bus)."""
    report = StatusReport(
        runtime="distributed", bus=f"kafka {bootstrap}" + (f" prefix={prefix}" if prefix else "")
    )
    try:
        report.topics = await topic_lags(bus)
    except BusError as exc:
        report.problems.append(f"bus: {exc}")
        return report
    try:
        groups = await kafka_group_members(bootstrap, prefix, list(SERVICE_GROUPS))
    except Exception as exc:  # aiokafka raises a wide family; status reports it instead of crashing
        report.problems.append(f"consumer groups: {type(exc).__name__}: {exc}")
        groups = {}
    for group, service in SERVICE_GROUPS.items():
        info = groups.get(group, {"state": "Dead", "members": 0})
        up = info["members"] > 0
        report.services[service] = {"up": up, "group": group, **info}
        if not up:
            report.problems.append(f"{service}: no live consumer in group {group!r}")
    report.control = (await read_control(bus, timeout_s=timeout_s)).as_dict()
    return report
