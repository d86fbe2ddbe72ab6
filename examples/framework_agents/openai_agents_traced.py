"""The Agents SDK calculator (``openai_agents_sdk.py``) with its tracing sent as OpenTelemetry spans.

The Agents SDK traces every run: the agent, each model call, each tool call. OpenInference's
instrumentor (``openinference-instrumentation-openai-agents``) turns those traces into OpenTelemetry
spans, and OpenTelemetry's own OTLP/HTTP exporter sends them to ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
by default the OTLP route of the server the model calls go to: ``OPENAI_BASE_URL + "/traces"``. Run
under Flywheel, that is the episode's URL, so the spans land in the episode beside its calls. The
instrumentor's processor replaces the SDK's default one: nothing is uploaded to api.openai.com.

The task arrives as JSON on stdin (``{"input": {"question": ...}}``); the last stdout line is the result
``{"output": {"answer": <final text>, "tool_calls": [...]}}``.

    echo '{"input": {"question": "What is 3 times 4 times 5?"}}' | python examples/framework_agents/openai_agents_traced.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from agents import Agent, Runner, function_tool
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TOOL_CALLS: list[dict[str, int]] = []


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    time.sleep(0.02)  # a tool that takes time, as real ones do: its span shows how long
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


agent = Agent(
    name="calculator",
    instructions="You are a calculator. Use the multiply tool for every product, then state the result.",
    tools=[multiply],
    model=os.environ.get("OPENAI_MODEL", "policy"),
)


def start_tracing() -> TracerProvider:
    """OpenTelemetry for this process: the SDK's traces as spans, batched to the OTLP endpoint."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/traces"
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "calculator"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    return provider


def main() -> None:
    task = json.loads(sys.stdin.read())
    provider = start_tracing()
    try:
        done = asyncio.run(Runner.run(agent, task["input"]["question"], max_turns=6))
    finally:
        provider.shutdown()  # sends what is queued before the process (and so the episode) ends
    print(json.dumps({"output": {"answer": str(done.final_output), "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()
