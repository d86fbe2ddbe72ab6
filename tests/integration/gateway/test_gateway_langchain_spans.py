"""A LangChain program's spans, emitted by a LangChain callback (OpenInference's ``LangChainInstrumentor``
adds its tracer to every run's callbacks), sent by OpenTelemetry's OTLP/HTTP exporter to the episode's
URL, and attached to that episode by the gateway (docs/observability.md, "Spans from the agent").

The gateway serves on a real port (``BackgroundGateway``) in front of a canned upstream; the program is
real LangChain: a chat model call through ``ChatOpenAI`` at the episode's base URL and a ``@tool``,
both inside one runnable, so the callback makes one trace of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# imported here, before the test's warning filters are set: langchain_core's import adds its own filter
# that shows its deprecation warnings, which would otherwise sit above pytest's "error"
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from schemas import AgentSpansRecorded
from tests.fakes.gateway_harness import BackgroundGateway

pytestmark = [
    pytest.mark.timeout(60),
    # OpenInference's LangChain instrumentation (0.1.80) reads a message's text the way LangChain 1.x
    # deprecated; the warning is the library's, not this program's
    pytest.mark.filterwarnings(r"ignore:Calling \.text\(\) as a method is deprecated"),
]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[BackgroundGateway]:
    with BackgroundGateway(tmp_path) as g:
        yield g


def test_a_langchain_callbacks_spans_land_in_the_episode(gw: BackgroundGateway) -> None:
    episode_id = gw.open_episode()
    base_url = gw.episode_url(episode_id)

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    llm = ChatOpenAI(base_url=base_url, api_key="unused", model="policy", max_retries=0)
    ask = ChatPromptTemplate.from_messages([("user", "{question}")]) | llm | StrOutputParser()

    def calculate(question: str) -> str:
        said = ask.invoke({"question": question})
        return f"{said} {multiply.invoke({'a': 3, 'b': 4})}"

    provider = TracerProvider(resource=Resource.create({"service.name": "lc-calculator"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=base_url + "/traces")))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        answer = RunnableLambda(calculate).with_config(run_name="calculator").invoke("What is 3 times 4?")
    finally:
        instrumentor.uninstrument()
        provider.shutdown()  # sends the batch
    assert answer.endswith("12")

    def got_spans(e: object) -> bool:
        return isinstance(e, AgentSpansRecorded) and e.episode_id == episode_id

    events = gw.run(gw.h.events.wait_for(got_spans, 10.0), 15.0)
    spans = [s for e in events for s in e.spans]
    kind = {s.name: s.attributes.get("openinference.span.kind") for s in spans}
    assert kind["calculator"] == "CHAIN" and kind["multiply"] == "TOOL" and kind["ChatOpenAI"] == "LLM", kind
    assert len({s.trace_id for s in spans}) == 1 and {s.service_name for s in spans} == {"lc-calculator"}
    by_name = {s.name: s for s in spans}
    root = by_name["calculator"]
    assert root.parent_span_id is None and by_name["multiply"].parent_span_id == root.span_id
    assert root.start_time <= by_name["ChatOpenAI"].start_time <= by_name["multiply"].start_time
    assert by_name["multiply"].end_time <= root.end_time
    assert by_name["multiply"].attributes.get("output.value") == "12"
    [call] = gw.calls(episode_id, 1)  # and the model call itself, recorded as every call is
    assert call.episode_id == episode_id
