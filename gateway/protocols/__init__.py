"""The agent protocols beside chat completions: the Responses API and Anthropic Messages, their
streams, and the dialect machinery that serves them through the chat path."""
