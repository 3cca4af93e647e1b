"""Chat templates written for these tests in the styles published models use,
and the conversations they are rendered over.

Each template leans on what published templates lean on: ``namespace``
state carried across loops, ``loop.index0`` / ``loop.last`` / reversed
message lists, macros (one recursive, rendering a JSON schema), tools as
JSON, tool calls and tool results, reasoning split off at ``</think>``,
``raise_exception``, ``selectattr`` / ``map`` / ``join`` / ``tojson``
with indents, ``{% generation %}`` and whitespace control. Published
templates can be added as files (``templates/README.md``).
"""
from __future__ import annotations

from . import family_templates as ft

CHATML_TOOLS_REASONING = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n\\nFunction signatures in <tools></tools>:\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}
        {%- if not reasoning and '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set call = call.function if call.function else call %}
            {{- '\\n<tool_call>\\n{"name": "' ~ call.name ~ '", "arguments": ' }}
            {{- call.arguments if call.arguments is string else call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

LLAMA3_TOOLS = """{{- bos_token }}
{%- set date_string = date_string if date_string is defined else "26 Jul 2024" %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
        {%- if loop.first and tools is not none %}
            {{- '<|start_header_id|>user<|end_header_id|>\\n\\nFunctions:\\n' }}
            {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
            {{- '<|eot_id|>' }}
        {%- endif %}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}' }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {{- message.content | tojson if message.content is mapping or message.content is iterable and message.content is not string else message.content }}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""

# A recursive macro renders each tool's parameter schema as a TypeScript-like type.
MACRO_SCHEMA = """{%- macro render_type(schema, depth) -%}
    {%- if schema.type == 'object' -%}
        {{- '{' -}}
        {%- for name, sub in (schema.properties or {}).items() -%}
            {{- name }}{{ '' if name in (schema.required or []) else '?' }}: {{ render_type(sub, depth + 1) -}}
            {{- ', ' if not loop.last -}}
        {%- endfor -%}
        {{- '}' -}}
    {%- elif schema.type == 'array' -%}
        {{- render_type(schema['items'], depth + 1) }}[]
    {%- elif schema.enum -%}
        {{- schema.enum | map('tojson') | join(' | ') -}}
    {%- else -%}
        {{- {'string': 'string', 'integer': 'number', 'number': 'number', 'boolean': 'boolean'}.get(schema.type, 'any') -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro turn(role, text) -%}<|{{ role }}|>{{ text }}<|end|>{%- endmacro -%}
{%- if tools -%}
    {%- set lines = [] -%}
    {%- for t in tools -%}
        {%- set f = t.function -%}
        {%- set lines = lines + ['// ' ~ f.description ~ '\\ntype ' ~ f.name ~ ' = (_: ' ~ render_type(f.parameters, 0) ~ ') => any;'] -%}
    {%- endfor -%}
    {{- turn('developer', '# Tools\\n' ~ lines | join('\\n')) -}}
{%- endif -%}
{%- for m in messages -%}
    {%- if m.role == 'assistant' and m.tool_calls -%}
        {{- turn('assistant', m.tool_calls | map(attribute='function') | map(attribute='name') | join(',')) -}}
    {%- elif m.role == 'tool' -%}
        {{- turn('tool', m.content | string | truncate(40, true, '…', 0)) -}}
    {%- else -%}
        {%- generation -%}{{- turn(m.role, m.content | default('', true)) -}}{%- endgeneration -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"""

GEMMA_STYLE = """{{ bos_token }}
{%- set ns = namespace(first_user_prefix='', turns=0) -%}
{%- if messages[0]['role'] == 'system' -%}
    {%- set ns.first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages | rejectattr('role', 'equalto', 'tool') -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {%- set ns.turns = ns.turns + 1 -%}
    {{ '<start_of_turn>' + role + '\\n' + (ns.first_user_prefix if loop.first else '') }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- else -%}<image>{%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
{{ '' if ns.turns else raise_exception('no turns') }}"""

MISTRAL_STYLE = """{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- if tools and message == user_messages[-1] %}
            {{- '[AVAILABLE_TOOLS]' + tools | map(attribute='function') | list | tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {{- '[INST] ' + message.content + ' [/INST]' }}
    {%- elif message.tool_calls is defined %}
        {{- '[TOOL_CALLS][' }}
        {%- for call in message.tool_calls %}
            {%- if call.id is not defined or call.id | length != 9 %}
                {{- raise_exception('Tool call ids must be 9 characters') }}
            {%- endif %}
            {{- {'name': call.function.name, 'arguments': call.function.arguments, 'id': call.id} | tojson }}
            {{- ', ' if not loop.last else ']' + eos_token }}
        {%- endfor %}
    {%- elif message.role == 'tool' %}
        {{- '[TOOL_RESULTS]' + {'content': message.content, 'call_id': message.tool_call_id} | tojson(sort_keys=true) + '[/TOOL_RESULTS]' }}
    {%- elif message.role == 'assistant' %}
        {{- ' ' + message.content | trim + eos_token }}
    {%- elif message.role == 'system' and not loop.first %}
        {{- raise_exception('A system message must come first') }}
    {%- endif %}
{%- endfor %}"""

# The corpus, one table. The family formats (the comments in family_templates.py
# say which format each renders): Llama 3.1 with tools (llama3-tools), Qwen 2.5
# and Qwen 3 with tools and thinking, Gemma 3, DeepSeek-R1, Phi-4, Mistral v3
# with tools (mistral-style) and Mistral Small 3 (v7), Muse Glimmer's ATEM tool
# calls. The rest exercise what templates lean on in other shapes.
TEMPLATES = {"chatml-tools-reasoning": CHATML_TOOLS_REASONING, "llama3-tools": LLAMA3_TOOLS,
             "macro-schema": MACRO_SCHEMA, "gemma-style": GEMMA_STYLE,
             "mistral-style": MISTRAL_STYLE, "qwen2.5-tools": ft.QWEN25_TOOLS,
             "qwen3-tools-thinking": ft.QWEN3_TOOLS_THINKING, "gemma3": ft.GEMMA3,
             "deepseek-r1": ft.DEEPSEEK_R1, "phi-4": ft.PHI4, "mistral-v7": ft.MISTRAL_V7,
             "glimmer-atem": ft.GLIMMER_ATEM}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now at a place.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "Café, Zürich or 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "array", "items": {"type": "object", "properties": {
            "offset": {"type": "integer"}, "hourly": {"type": "boolean"}}}}}}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search <the> web & return \"snippets\".",
    "parameters": {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}}}

CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}
CALL_TEXT = {"id": "call67890", "type": "function",
             "function": {"name": "search", "arguments": "{\"q\": \"rain <b>\"}"}}

# name -> (messages, tools)
CONVERSATIONS = {
    "one turn": ([{"role": "user", "content": "Hello there!"}], None),
    "system and turns": ([
        {"role": "system", "content": "  You answer in one line.  "},
        {"role": "user", "content": "What is 2+2?\n"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 × 3? Ünïcode «ok» 日本"},
    ], None),
    "tools": ([
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 °C."},
        {"role": "user", "content": "Thanks. Search rain?"},
    ], [WEATHER, SEARCH]),
    "tool call as text": ([
        {"role": "user", "content": "Search rain"},
        {"role": "assistant", "content": "", "tool_calls": [CALL_TEXT]},
        {"role": "tool", "tool_call_id": "call67890", "content": "snippet one"},
    ], [SEARCH]),
    "reasoning": ([
        {"role": "user", "content": "Think first: 17 * 3?"},
        {"role": "assistant", "content": "<think>\n17 * 3 = 51\n</think>\n\n51", "reasoning_content": None},
        {"role": "user", "content": "And 51 / 3?"},
        {"role": "assistant", "content": "17", "reasoning_content": "51 / 3 is 17"},
    ], None),
    "not alternating": ([
        {"role": "user", "content": "one"}, {"role": "user", "content": "two"},
    ], None),
}

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def special_tokens(name: str) -> dict[str, str]:
    """The special token strings template ``name`` is rendered with."""
    return {**SPECIAL_TOKENS, **ft.FAMILY_TOKENS.get(name, {})}


def render_variables(name: str) -> list[dict]:
    """The sets of extra variables template ``name`` is rendered with: none,
    and each of ``family_templates.RENDER_VARIABLES``."""
    return [{}, *ft.RENDER_VARIABLES.get(name, [])]
