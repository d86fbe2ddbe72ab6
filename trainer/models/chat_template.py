"""The chat template the built models carry: Qwen2.5-style ChatML with tools, the format vLLM's ``hermes``
tool parser reads (the tiny model, :mod:`trainer.models.tiny`, and SmolLM2, :mod:`trainer.models.smollm2`).
"""

# Qwen2.5-style ChatML. No default system message (a tiny model's context is short); tools are listed
# in the system turn, assistant tool calls render as <tool_call>{json}</tool_call>, and consecutive
# tool results are grouped into one user turn of <tool_response> blocks, as Qwen's template does.
CHAT_TEMPLATE = """\
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
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if messages and messages[0].role == 'system' -%}{{- render(messages[0].content) + '\\n\\n' -}}{%- endif -%}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
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
        {{- '<|im_end|>\\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
