"""Kubernetes agents: one Job per episode, rendered from a user-supplied Job template.

The template (the path is the agent spec) is an ordinary ``batch/v1`` Job in YAML or JSON, or an Agent
Lightning 1.0 Job template: a Jinja2 text rendered, as AGL's Kubernetes controller renders it
(``agentlightning/controller/k8s_reconciler.py``), with ``job_name``, ``input`` (the task's input) and
the ``yaml_escape`` filter (a JSON-quoted string), to exactly one YAML document that is a Job. A
template without Jinja syntax renders to itself, so there is one path for both. Jinja runs sandboxed:
a template may not reach Python's internals.

Then, for each episode, as AGL does for a rollout: the Job is named ``flywheel-<episode prefix>`` (the
``job_name`` the template saw), labelled ``app.kubernetes.io/managed-by: flywheel``,
``agentlightning/rollout-id: <episode>``, ``agentlightning/attempt-id: "0"`` and
``flywheel.dev/episode`` (the pod too), given ``backoffLimit: 0`` (retries are Flywheel's, as new
attempts), ``ttlSecondsAfterFinished``, ``activeDeadlineSeconds`` (the episode deadline) and
``restartPolicy: Never``. Every container gets the episode's environment, replacing entries of the same
names: Flywheel's (``OPENAI_BASE_URL``, ``OPENAI_API_BASE``, ``OPENAI_API_KEY``, ``FLYWHEEL_TASK``, …)
and AGL's three, so an AGL agent image runs unchanged: ``AGL_OPENAI_BASE_URL`` (the episode's gateway
URL: every call recorded token-faithfully), ``AGL_EVENT_URL`` (the gateway's
``/episodes/<id>/agl/events``: events are kept, a ``reward`` event is the episode's reported reward)
and ``AGL_KEY`` (the episode token). What differs from AGL by design: the name prefix, the managed-by
label's value, and the URLs, which point at Flywheel's gateway rather than at ``agl-server``.

The runner polls the Job's status until it succeeds, fails, or the deadline passes (then it deletes the
Job with its pods → ``timeout``). The agent's result is the last JSON line of its pod's log, if any.

Tested against a fake API and against AGL 1.0.2's own renderer (tests/compat); untested against a live
cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from functools import cache
from pathlib import Path
from typing import Any

from rollout_worker.runners import AgentResult, AgentRun, AgentSpecError, Stopwatch, parse_final_line
from schemas import EpisodeStatus

LABEL = "flywheel.dev/episode"
AGL_ATTEMPT = "0"  # AGL's DEFAULT_ATTEMPT_ID: one Job per attempt, and Flywheel's attempts are episodes


def _yaml_escape(value: object) -> str:
    return json.dumps(str(value), ensure_ascii=True)


@cache
def _jinja() -> Any:
    """The sandboxed environment (jinja2 and PyYAML come with the ``k8s`` extra, imported on first use)."""
    import jinja2.sandbox

    env = jinja2.sandbox.SandboxedEnvironment()
    env.filters["yaml_escape"] = _yaml_escape
    return env


class InputMismatchError(AgentSpecError):
    """The task's input lacks a field the Job template uses (checked per episode, not at load)."""


class JobTemplate:
    """A Job template file, compiled once; :meth:`render` gives one episode's Job before injection."""

    def __init__(self, path: str, text: str) -> None:
        import jinja2

        self.path = path
        try:
            self._template = _jinja().from_string(text)
        except jinja2.TemplateSyntaxError as exc:
            raise AgentSpecError(path, f"Job template is not a valid Jinja2 template: {exc}") from exc

    def render(self, name: str, task_input: Any) -> dict[str, Any]:
        import jinja2
        import yaml

        try:
            text = self._template.render(job_name=name, input=task_input)
        except jinja2.UndefinedError as exc:
            raise InputMismatchError(
                self.path, f"the task's input lacks what the Job template uses: {exc}"
            ) from exc
        except jinja2.TemplateError as exc:
            raise AgentSpecError(self.path, f"rendering the Job template failed: {exc}") from exc
        try:
            docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
        except yaml.YAMLError as exc:
            raise AgentSpecError(self.path, f"Job template is not valid YAML/JSON: {exc}") from exc
        if len(docs) != 1:
            raise AgentSpecError(
                self.path, f"the Job template must render one YAML document, not {len(docs)}"
            )
        job = docs[0]
        if not isinstance(job, dict) or job.get("kind") != "Job":
            raise AgentSpecError(self.path, "the template must be a batch/v1 Job")
        containers = job.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
        if not isinstance(containers, list) or not containers:
            raise AgentSpecError(self.path, "the Job template has no containers")
        return job


def load_template(path: str) -> JobTemplate:
    """Read and compile ``path``, and check that it renders a Job (with an empty input, where it can)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AgentSpecError(path, f"cannot read Job template: {exc}") from exc
    template = JobTemplate(path, text)
    with contextlib.suppress(InputMismatchError):  # it needs a real input: checked per episode
        template.render("flywheel-check", {})
    return template


def job_name(episode_id: str) -> str:
    return f"flywheel-{episode_id[:20]}"  # DNS-1123: lowercase hex is safe, well under 63 characters


def agl_env(base_url: str, key: str) -> dict[str, str]:
    """AGL's three variables for an episode whose gateway URL is ``{gateway}/episodes/{id}/v1``."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return {"AGL_OPENAI_BASE_URL": base_url, "AGL_EVENT_URL": f"{root}/agl/events", "AGL_KEY": key}


def render_job(template: JobTemplate, run: AgentRun, *, ttl_after_finished_s: int) -> dict[str, Any]:
    name = job_name(run.episode_id)
    job = template.render(name, run.task.get("input"))  # a fresh dict from YAML each time
    meta = job.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta["name"] = name
    labels = meta.setdefault("labels", {})
    labels.update({
        "app.kubernetes.io/managed-by": "flywheel",
        "agentlightning/rollout-id": run.episode_id,
        "agentlightning/attempt-id": AGL_ATTEMPT,
        LABEL: run.episode_id,
    })  # fmt: skip
    spec = job.setdefault("spec", {})
    spec["activeDeadlineSeconds"] = max(1, int(run.deadline_s + 0.999))
    spec["ttlSecondsAfterFinished"] = ttl_after_finished_s
    spec["backoffLimit"] = 0
    pod = spec.setdefault("template", {})
    pod.setdefault("metadata", {}).setdefault("labels", {})[LABEL] = run.episode_id
    pod_spec = pod.setdefault("spec", {})
    pod_spec["restartPolicy"] = "Never"
    episode_env = run.env()
    injected = {**episode_env, **agl_env(run.llm.base_url, run.llm.api_key)}
    for container in pod_spec.get("containers", []):
        env = [e for e in container.get("env", []) if e.get("name") not in injected]
        env.extend({"name": k, "value": v} for k, v in injected.items())
        container["env"] = env
    return job


class RateLimiter:
    """At most ``per_minute`` acquisitions in any sliding 60 s window."""

    def __init__(self, per_minute: int, clock: Any = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.stamps: deque[float] = deque()
        self.lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self.lock:
            while True:
                now = self.clock()
                while self.stamps and now - self.stamps[0] >= 60.0:
                    self.stamps.popleft()
                if len(self.stamps) < self.per_minute:
                    self.stamps.append(now)
                    return
                await asyncio.sleep(60.0 - (now - self.stamps[0]))


def _get(obj: Any, name: str) -> Any:
    """Read a field from the client's model objects or from plain dicts (the fake API returns dicts)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


class KubernetesRunner:
    def __init__(
        self,
        *,
        namespace: str = "default",
        jobs_per_minute: int = 60,
        ttl_after_finished_s: int = 600,
        poll_s: float = 2.0,
        batch_api: Any = None,
        core_api: Any = None,
    ) -> None:
        self.namespace = namespace
        self.ttl = ttl_after_finished_s
        self.poll_s = poll_s
        self.limiter = RateLimiter(jobs_per_minute)
        self._batch = batch_api
        self._core = core_api
        self._templates: dict[str, JobTemplate] = {}

    def _apis(self) -> tuple[Any, Any]:
        if self._batch is None or self._core is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call, unused-ignore]  # typed from kubernetes 36 on
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call, unused-ignore]
            self._batch = self._batch or client.BatchV1Api()
            self._core = self._core or client.CoreV1Api()
        return self._batch, self._core

    async def run(self, run: AgentRun) -> AgentResult:
        template = self._templates.get(run.agent.spec)
        if template is None:
            template = self._templates[run.agent.spec] = load_template(run.agent.spec)
        body = render_job(template, run, ttl_after_finished_s=self.ttl)  # AgentSpecError: the episode fails
        batch, core = self._apis()
        await self.limiter.acquire()
        watch = Stopwatch()
        name = body["metadata"]["name"]
        try:
            await asyncio.to_thread(batch.create_namespaced_job, self.namespace, body)
        except Exception as exc:  # the client raises ApiException and urllib3 errors
            return AgentResult(status=EpisodeStatus.error, error=f"creating Job {name} failed: {exc}")
        try:
            status = await asyncio.wait_for(self._watch(batch, name), timeout=max(run.deadline_s, 0.001))
        except TimeoutError:
            await self._delete(batch, name)
            return AgentResult(
                status=EpisodeStatus.timeout,
                error=f"deadline of {run.deadline_s:g}s passed; Job {name} deleted",
                agent_s=watch.elapsed(),
            )
        except asyncio.CancelledError:
            await self._delete(batch, name)
            raise
        agent_s = watch.elapsed()
        logs = await self._logs(core, run.episode_id)
        output, reward, _ = parse_final_line(logs)
        if status == "succeeded":
            return AgentResult(status=EpisodeStatus.ok, output=output, reward=reward, agent_s=agent_s)
        if status == "deadline":
            return AgentResult(
                status=EpisodeStatus.timeout,
                output=output,
                error=f"Job {name}: DeadlineExceeded\n{logs[-2000:]}",
            )
        return AgentResult(
            status=EpisodeStatus.error,
            output=output,
            reward=reward,
            error=f"Job {name} failed\n{logs[-2000:]}",
            agent_s=agent_s,
        )

    async def _watch(self, batch: Any, name: str) -> str:
        while True:
            job = await asyncio.to_thread(batch.read_namespaced_job_status, name, self.namespace)
            status = _get(job, "status")
            if (_get(status, "succeeded") or 0) > 0:
                return "succeeded"
            for cond in _get(status, "conditions") or []:
                if _get(cond, "type") == "Failed" and _get(cond, "status") == "True":
                    return "deadline" if _get(cond, "reason") == "DeadlineExceeded" else "failed"
            if (_get(status, "failed") or 0) > 0:
                return "failed"
            await asyncio.sleep(self.poll_s)

    async def _delete(self, batch: Any, name: str) -> None:
        try:
            await asyncio.to_thread(
                batch.delete_namespaced_job, name, self.namespace, propagation_policy="Background"
            )
        except Exception:  # already gone or API down: the TTL controller cleans up
            return

    async def _logs(self, core: Any, episode_id: str) -> str:
        try:
            pods = await asyncio.to_thread(
                core.list_namespaced_pod, self.namespace, label_selector=f"{LABEL}={episode_id}"
            )
            items = _get(pods, "items") or []
            if not items:
                return ""
            pod_name = _get(_get(items[-1], "metadata"), "name")
            text = await asyncio.to_thread(
                core.read_namespaced_pod_log, pod_name, self.namespace, tail_lines=200
            )
            return text if isinstance(text, str) else json.dumps(text)
        except Exception:  # logs are best effort: the episode's calls are already recorded
            return ""

    async def aclose(self) -> None:
        return None
