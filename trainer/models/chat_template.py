"""The chat templates the built models carry, in the format vLLM's ``hermes`` tool parser reads: tools
listed in the first turn, assistant tool calls as ``<tool_call>{json}</tool_call>`` blocks, tool results
as ``<tool_response>`` blocks in a user turn.

- :data:`CHAT_TEMPLATE`: Qwen2.5-style ChatML (the tiny model, :mod:`trainer.models.tiny`, and SmolLM2,
  :mod:`trainer.models.smollm2`).
- :data:`GEMMA_CHAT_TEMPLATE`: Gemma's turns (Gemma 3, :mod:`trainer.models.gemma3`).
"""

# Message content as a string or a list of text parts.
_RENDER = """\
{%- macro render(content) -%}
    {%- if content is string -%}{{- content -}}
    {%- elif content -%}
        {%- for part in content -%}
            {%- if part is string -%}{{- part -}}
            {%- elif part.text is defined -%}{{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
"""

# The tool list and the instruction to answer in <tool_call> blocks, up to the example call's JSON.
_TOOLS = """\
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
"""

# An assistant message's tool calls, each a <tool_call> block (after its content, on a new line).
_TOOL_CALLS = """\
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                {%- if (not loop.first) or message.content -%}{{- '\\n' -}}{%- endif -%}
                {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' -}}
                {%- if call.arguments is string -%}{{- call.arguments -}}
                {%- else -%}{{- call.arguments | tojson -}}
                {%- endif -%}
                {{- '}\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
"""

# Qwen2.5-style ChatML. No default system message (a tiny model's context is short); tools are listed
# in the system turn, assistant tool calls render as <tool_call>{json}</tool_call>, and consecutive
# tool results are grouped into one user turn of <tool_response> blocks, as Qwen's template does.
CHAT_TEMPLATE = (
    _RENDER
    + """\
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if messages and messages[0].role == 'system' -%}{{- render(messages[0].content) + '\\n\\n' -}}{%- endif -%}
"""
    + _TOOLS
    + """\
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
    {{- '<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' + render(message.content) -}}
"""
    + _TOOL_CALLS
    + """\
        {{- '<|im_end|>\\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
)

# Gemma's turns: <bos>, then <start_of_turn>user|model ... <end_of_turn>. Gemma has no system turn: as
# its own template does, the system message (and here the tool list) opens the first user turn, or is a
# user turn of its own when the conversation does not start with one. Tool results are a user turn of
# <tool_response> blocks, as in ChatML above. Content is not trimmed (Gemma's template trims it), so a
# turn renders back exactly as the model wrote it.
GEMMA_CHAT_TEMPLATE = (
    _RENDER
    + """\
{{- bos_token -}}
{%- set ns = namespace(preamble='') -%}
{%- set first = 1 if messages and messages[0].role == 'system' else 0 -%}
{%- if first -%}{%- set ns.preamble = render(messages[0].content) -%}{%- endif -%}
{%- if tools -%}
    {%- set listing -%}
"""
    + _TOOLS
    + """\
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
    {%- endset -%}
    {%- set ns.preamble = (ns.preamble + '\\n\\n' if ns.preamble else '') + listing -%}
{%- endif -%}
{%- set turns = messages[first:] -%}
{%- if ns.preamble and not (turns and turns[0].role == 'user') -%}
    {{- '<start_of_turn>user\\n' + ns.preamble + '<end_of_turn>\\n' -}}
    {%- set ns.preamble = '' -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<start_of_turn>user' -}}{%- endif -%}
        {{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<end_of_turn>\\n' -}}{%- endif -%}
    {%- elif message.role == 'assistant' -%}
        {{- '<start_of_turn>model\\n' + render(message.content) -}}
"""
    + _TOOL_CALLS
    + """\
        {{- '<end_of_turn>\\n' -}}
    {%- elif loop.first and ns.preamble -%}
        {{- '<start_of_turn>user\\n' + ns.preamble + '\\n\\n' + render(message.content) + '<end_of_turn>\\n' -}}
    {%- else -%}
        {{- '<start_of_turn>' + message.role + '\\n' + render(message.content) + '<end_of_turn>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}
"""
)
