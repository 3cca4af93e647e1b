"""Chat templates in the prompt formats the major model families publish,
written here (none is a copy of a published template file). Each comment
names the format a template renders; ``chat_templates.TEMPLATES`` is the
table that lists them with the others, ``FAMILY_TOKENS`` the special
token strings each family's files name, ``FAMILY_CONTROL`` and
``FAMILY_USER`` every family's markup tokens (a vocabulary that holds them
all renders every template here), ``MUSE_TEMPLATE`` the Muse Glimmer tests'
plain turn template.
"""
from __future__ import annotations

# Qwen 2.5 instruct: ChatML turns, a default system prompt, tools as JSON
# lines inside <tools> in the system turn, calls as <tool_call> JSON (the
# arguments always through tojson), results grouped into one user turn of
# <tool_response> blocks.
QWEN25_TOOLS = """{%- set has_system = messages[0].role == 'system' %}
{%- set turns = messages[1:] if has_system else messages %}
{{- '<|im_start|>system\\n' }}
{{- messages[0].content if has_system else 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
{%- if tools %}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' ~ tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
        'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in turns %}
    {%- if message.role == 'tool' %}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' ~ message.content ~ '\\n</tool_response>' }}
        {%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\\n' ~ message.content }}{%- endif %}
        {%- for call in message.tool_calls %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '\\n<tool_call>\\n{"name": "' ~ fn.name ~ '", "arguments": ' ~ fn.arguments | tojson ~ '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' ~ message.role ~ '\\n' ~ message.content ~ '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

# Qwen 3: Qwen 2.5's tool format without the default system prompt; an
# assistant turn after the last real user query carries its reasoning in a
# <think> block (taken from reasoning_content, or split off the content at
# </think>), earlier ones lose it; string arguments go in as they are;
# enable_thinking=false closes an empty <think> block after the generation
# prompt.
QWEN3_TOOLS_THINKING = """{%- macro is_tool_result(text) -%}
    {{- 'yes' if text is string and text.startswith('<tool_response>') and text.endswith('</tool_response>') -}}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content ~ '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' ~ tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
        'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' ~ messages[0].content ~ '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' and not is_tool_result(message.content) %}{%- set ns.last_query = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' ~ message.role ~ '\\n' ~ content ~ '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}
        {%- if '</think>' in content %}
            {%- set head, _, tail = content.partition('</think>') %}
            {%- set reasoning = reasoning or head.split('<think>')[-1] %}
            {%- set content = tail %}
        {%- endif %}
        {%- set content = content.lstrip('\\n') %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<think>\\n' ~ reasoning.strip('\\n') ~ '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if not loop.first or content %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n{"name": "' ~ fn.name ~ '", "arguments": ' }}
            {{- fn.arguments if fn.arguments is string else fn.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' ~ content ~ '\\n</tool_response>' }}
        {%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""

# Gemma 3 instruct: bos, then user/model turns that must alternate; a
# system message becomes the first user turn's opening paragraph; text is
# trimmed, an image part is <start_of_image>.
GEMMA3 = """{%- macro body(content) -%}
    {%- if content is string -%}
        {{- content | trim -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'image' -%}{{- '<start_of_image>' -}}
            {%- elif part.type == 'text' -%}{{- part.text | trim -}}{%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if messages[0].role == 'system' -%}
    {%- set first = messages[0].content if messages[0].content is string else messages[0].content[0].text -%}
    {%- set prefix = first ~ '\\n\\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message.role == 'user') == loop.index0 is odd -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {{- '<start_of_turn>' ~ ('model' if message.role == 'assistant' else message.role) ~ '\\n' -}}
    {{- prefix if loop.first -}}
    {{- body(message.content) ~ '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"""

# DeepSeek-R1: bos and the system prompts joined by blank lines, then
# <｜User｜> / <｜Assistant｜> turns; an assistant turn keeps only what follows
# </think>; tool calls as fenced JSON between <｜tool▁call▁begin｜> markers,
# results in one <｜tool▁outputs▁begin｜> block; the generation prompt opens
# <think>.
DEEPSEEK_R1 = """{%- set ns = namespace(system=[], in_outputs=false) %}
{%- for message in messages if message.role == 'system' %}
    {%- set ns.system = ns.system + [message.content] %}
{%- endfor %}
{{- bos_token ~ ns.system | join('\\n\\n') }}
{%- for message in messages %}
    {%- if message.role != 'tool' and ns.in_outputs %}
        {{- '<｜tool▁outputs▁end｜>' }}
        {%- set ns.in_outputs = false %}
    {%- endif %}
    {%- if message.role == 'user' %}
        {{- '<｜User｜>' ~ message.content }}
    {%- elif message.role == 'assistant' %}
        {%- set content = (message.content or '').split('</think>')[-1] %}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' %}{{- '<｜Assistant｜>' }}{%- endif %}
        {{- content }}
        {%- if message.tool_calls %}
            {{- '<｜tool▁calls▁begin｜>' }}
            {%- for call in message.tool_calls %}
                {%- set args = call.function.arguments %}
                {{- '\\n' if not loop.first }}
                {{- '<｜tool▁call▁begin｜>' ~ call.type ~ '<｜tool▁sep｜>' ~ call.function.name }}
                {{- '\\n```json\\n' ~ (args if args is string else args | tojson) ~ '\\n```<｜tool▁call▁end｜>' }}
            {%- endfor %}
            {{- '<｜tool▁calls▁end｜>' }}
        {%- endif %}
        {{- '<｜end▁of▁sentence｜>' }}
    {%- elif message.role == 'tool' %}
        {{- '\\n' if ns.in_outputs else '<｜tool▁outputs▁begin｜>' }}
        {{- '<｜tool▁output▁begin｜>' ~ message.content ~ '<｜tool▁output▁end｜>' }}
        {%- set ns.in_outputs = true %}
    {%- endif %}
{%- endfor %}
{%- if ns.in_outputs %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}
{%- if add_generation_prompt and not ns.in_outputs %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"""

# Phi-4 (14B): every system, user and assistant message as
# <|im_start|>role<|im_sep|>text<|im_end|>, with no newlines; other roles
# are left out.
PHI4 = """{%- for message in messages if message.role in ('system', 'user', 'assistant') -%}
    <|im_start|>{{ message.role }}<|im_sep|>{{ message.content }}<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant<|im_sep|>{%- endif -%}"""

# Mistral Small 3 (the v7 tekken format): bos, [SYSTEM_PROMPT] blocks,
# [INST]...[/INST] with no spaces, an assistant reply closed by eos; any
# other role is refused.
MISTRAL_V7 = """{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- '[SYSTEM_PROMPT]' ~ message.content ~ '[/SYSTEM_PROMPT]' }}
    {%- elif message.role == 'user' %}
        {{- '[INST]' ~ message.content ~ '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        {{- message.content ~ eos_token }}
    {%- else %}
        {{- raise_exception('Only user, system and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""

# Muse Glimmer: channelled messages <|start|>ROLE[ to=RECIPIENT]<|message|>
# BODY, ended by <|eot|> (turn over) or <|eom|> (more to come). The system
# message ends with the reasoning strength (reasoning_strength, default
# high) and the valid recipients ("self", a tool namespace as "ns.*" or an
# undotted tool's name, "user"); tools add the ATEM calling instructions,
# a metadata line per namespace and a schema line per function (parameters
# as compact JSON). Reasoning after the last user message is a to=self
# message; a tool call is a to=TOOL message holding an
# <atem:function_calls> block, one <atem:parameter> per argument (strings
# as they are, anything else as JSON); a result is a `tool NAME` message in
# <tool_output>, NAME taken from the message or from the call whose id it
# answers. The generation prompt is a bare <|start|>assistant. The date line
# the release's default system prompt adds from the clock is left out, so
# a render does not depend on the day.
GLIMMER_ATEM = """{%- macro atem_call(name, arguments) -%}
    {{- '<|start|>assistant to=' ~ name ~ '<|message|><atem:function_calls>\\n<atem:invoke name="' ~ name ~ '">\\n' -}}
    {%- if arguments is mapping -%}
        {%- for key, value in arguments.items() -%}
            {{- '<atem:parameter name="' ~ key ~ '">' ~ (value if value is string else value | tojson) ~ '</atem:parameter>\\n' -}}
        {%- endfor -%}
    {%- else -%}
        {{- arguments ~ '\\n' -}}
    {%- endif -%}
    {{- '</atem:invoke>\\n</atem:function_calls><|eom|>' -}}
{%- endmacro -%}
{%- set ns = namespace(recipients=['"self"'], spaces=[], last_user=-1) -%}
{%- for tool in tools or [] -%}
    {%- set name = (tool.function or tool).name -%}
    {%- if '.' in name -%}
        {%- set space = name.split('.')[0] -%}
        {%- if space not in ns.spaces -%}
            {%- set ns.spaces = ns.spaces + [space] -%}
            {%- set ns.recipients = ns.recipients + ['"' ~ space ~ '.*"'] -%}
        {%- endif -%}
    {%- else -%}
        {%- set ns.recipients = ns.recipients + ['"' ~ name ~ '"'] -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{{- '<|start|>system<|message|>' -}}
{{- messages[0].content if messages[0].role == 'system' else 'You are a helpful AI assistant.\\nKnowledge cutoff: 2026-01-04.' -}}
{{- '\\n\\nReasoning strength: ' ~ (reasoning_strength if reasoning_strength is defined else 'high') ~ '.' -}}
{%- if tools -%}
    {{- '\\n\\nIn this environment you have access to a set of tools you can use to answer the user\\'s question.\\n\\n'
        'You can invoke a function by writing a "<atem:function_calls>" block like the following:\\n'
        '<atem:function_calls>\\n<atem:invoke name="$FUNCTION_NAME">\\n'
        '<atem:parameter name="$PARAMETER_NAME">$PARAMETER_VALUE</atem:parameter>\\n...\\n'
        '</atem:invoke>\\n</atem:function_calls>\\n\\n'
        'String and scalar parameters should be specified as is, while lists and objects should use JSON format. '
        'Note that spaces for string values are not stripped. '
        'The output is not expected to be valid XML and is parsed with regular expressions.\\n'
        'Here are the functions available in JSONSchema format:\\n' -}}
    {%- if ns.spaces -%}
        {{- '// Tool metadata\\n' -}}
        {%- for space in ns.spaces -%}{{- {'name': space, 'description': ''} | tojson ~ '\\n' -}}{%- endfor -%}
    {%- endif -%}
    {{- '// Function schemas\\n' -}}
    {%- for tool in tools -%}
        {%- set fn = tool.function or tool -%}
        {{- '{"name": ' ~ fn.name | tojson ~ ', "description": ' ~ (fn.description or '') | tojson -}}
        {{- ', "parameters": ' ~ fn.parameters | tojson(separators=(',', ':')) ~ '}\\n' -}}
    {%- endfor -%}
    {{- '\\nHere\\'s an example of how to call a function in the tool set:\\n'
        '(If the tool namespace is not specified, invoke the function directly as `example_function_name` '
        'rather than `example_tool_name.example_function_name`)\\n\\n'
        'to=example_tool_name.example_function_name\\n\\n'
        '<atem:function_calls>\\n<atem:invoke name="example_tool_name.example_function_name">\\n'
        '<atem:parameter name="example_parameter_1">value_1</atem:parameter>\\n'
        '<atem:parameter name="example_parameter_2">This is the value for the second parameter\\n'
        'that can span\\n"multiple" lines\\n</atem:parameter>\\n</atem:invoke>\\n</atem:function_calls>' -}}
{%- endif -%}
{{- '\\n\\n# Valid recipients: ' ~ (ns.recipients + ['"user"']) | join(', ') ~ '.<|eot|>' -}}
{%- for message in messages -%}
    {%- if message.role in ('user', 'system') and not (loop.first and message.role == 'system') -%}
        {{- '<|start|>' ~ message.role ~ '<|message|>' ~ message.content ~ '<|eot|>' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = message.content or '' -%}
        {%- set reasoning = message.reasoning_content or '' -%}
        {%- if '</think>' in content -%}
            {%- set reasoning = reasoning or content.split('</think>')[0].replace('<think>', '').strip() -%}
            {%- set content = content.split('</think>')[-1].strip() -%}
        {%- endif -%}
        {%- if reasoning and loop.index0 > ns.last_user -%}
            {{- '<|start|>assistant to=self<|message|>' ~ reasoning ~ '<|eom|>' -}}
        {%- endif -%}
        {%- for call in message.tool_calls or [] -%}
            {{- atem_call(call.function.name, call.function.arguments) -}}
        {%- endfor -%}
        {%- if content -%}{{- '<|start|>assistant<|message|>' ~ content ~ '<|eot|>' -}}{%- endif -%}
    {%- elif message.role == 'tool' -%}
        {%- set found = namespace(name=message.name or 'tool') -%}
        {%- for earlier in messages[:loop.index0] if not message.name -%}
            {%- for call in earlier.tool_calls or [] if call.id == message.tool_call_id -%}
                {%- set found.name = call.function.name -%}
            {%- endfor -%}
        {%- endfor -%}
        {{- '<|start|>tool ' ~ found.name ~ '<|message|><tool_output name="' ~ found.name ~ '">\\n' -}}
        {{- message.content ~ '\\n</tool_output><|eot|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"""

# name -> the special token strings that family's files name (the others use
# chat_templates.SPECIAL_TOKENS); both renderers get the same ones.
FAMILY_TOKENS = {
    "llama3-tools": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "deepseek-r1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "phi-4": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"},
    "glimmer-atem": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
}

# name -> extra variables the template reads; each set is rendered besides the plain render.
RENDER_VARIABLES = {
    "qwen3-tools-thinking": [{"enable_thinking": False}, {"enable_thinking": True}],
    "glimmer-atem": [{"reasoning_strength": "low"}],
}

# DeepSeek-R1's markers: outside GPT-2's byte alphabet (U+FF5C, U+2581).
R1_CONTROL = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")
R1_USER = ("<think>", "</think>", "<｜tool▁sep｜>")

# Every family's markup, CONTROL and USER_DEFINED as the families' files type it.
FAMILY_CONTROL = ("<s>", "</s>", "<unk>", "<pad>", "<|begin_of_text|>", "<|end_of_text|>",
                  "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<bos>", "<eos>",
                  "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|assistant|>",
                  "<|end|>", "<|eom|>", "<|eot|>", "<|message|>", "<|start|>", "<start_of_turn>",
                  "<end_of_turn>", "<start_of_image>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                  "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                  "[TOOL_RESULTS]", "[/TOOL_RESULTS]") + R1_CONTROL + (
                  "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                  "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                  "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>")
FAMILY_USER = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>", "<tools>", "</tools>", "</tool_output>", "<image>")

MUSE_TEMPLATE = ("{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|eot|>"
                 "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")
