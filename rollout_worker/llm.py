"""What a callable agent receives as ``llm``: where to send its OpenAI calls for this episode.

Agents never import this class: they use the three attributes (duck typing), so an agent written
against ``openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)`` runs unchanged anywhere.
A command agent also gets Anthropic's variables: the same episode serves ``/v1/messages``, and the
``anthropic`` SDK (and what builds on it, LangChain's ``ChatAnthropic``) adds the ``/v1`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LLM:
    base_url: str  # ``{gateway}/episodes/{episode_id}/v1``
    api_key: str  # the episode id: unguessable, so it works as the episode's token
    model: str  # the model name to ask for

    def env(self) -> dict[str, str]:
        """The environment variables a command agent gets for the same episode."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_BASE": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": self.base_url.removesuffix("/").removesuffix("/v1"),
            "ANTHROPIC_API_KEY": self.api_key,
            "FLYWHEEL_MODEL": self.model,
        }
