"""A chat template is code from the file: every render is bounded in CPU
time, value and output size, total work and call depth, and stops with a
ChatTemplateError naming the bound and the key, within bounded memory.

The issue's four cases (three nested range(99999), 'x' * 3000000000, a
string doubled 40 times, a macro calling itself) and the other hostile
templates run in a child process under an address-space limit, so a bound
that did not hold fails the test instead of exhausting the machine;
tracemalloc's peak is checked besides.

No verdict here depends on the machine's speed or load. A template that
must stop at a counted bound (size, work, recursion) renders with the time
bound an hour away, so which bound stops it is decided by counting alone;
one that must stop at the time bound never ends otherwise (1e10 steps or
more), so only how long it takes depends on the machine. CPU seconds are
checked with margins of 10x or more."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from muser_torch.errors import ChatTemplateError
from muser_torch.text.chat_limits import DEFAULT_SECONDS, ChatLimits

from .chat_templates import (CONVERSATIONS, SEARCH, TEMPLATES, WEATHER, render_variables,
                             special_tokens)

pytest.importorskip("jinja2")
from muser_torch.text.chat import ChatTemplate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "tokenizer.chat_template"
HI = [{"role": "user", "content": "hi"}]

ISSUE_CASES = {
    "three nested range(99999)":
        "{% for a in range(99999) %}{% for b in range(99999) %}{% for c in range(99999) %}"
        "{% endfor %}{% endfor %}{% endfor %}",
    "'x' * 3000000000": "{{ 'x' * 3000000000 }}",
    "a string doubled 40 times":
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s }}",
    "a macro calling itself": "{% macro f(x) %}{{ f(x ~ 'a') }}{% endmacro %}{{ f('') }}",
}
ENDLESS = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
ISSUE_BOUNDS = {"three nested range(99999)": "time bound",
                "'x' * 3000000000": "size bound",
                "a string doubled 40 times": "size bound",
                "a macro calling itself": "recursion bound"}

# Run in a child: the address space is capped at what the imports took plus
# 512 MB, so a render that allocated its way past a bound dies (MemoryError)
# instead of taking the machine.
CHILD = r"""
import json, resource, sys, time
from muser_torch.errors import ChatTemplateError
from muser_torch.text.chat import ChatTemplate
ChatTemplate("{{ 1 }}", {}).render([{"role": "user", "content": "warm"}])
with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
limit = vm + (512 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import tracemalloc
from muser_torch.text.chat_limits import ChatLimits
compiled = {}   # a template's first case compiles it (traced, bounded); the rest render it
for name, (src, seconds, *chat) in json.loads(sys.stdin.read()).items():
    messages, tools, tokens, generation_prompt, variables = chat or (
        [{"role": "user", "content": "hi"}], None, {}, True, {})
    key = json.dumps([src, seconds, tokens])
    tracemalloc.start()
    t = time.process_time()
    try:
        if key not in compiled:
            compiled[key] = ChatTemplate(src, tokens, ChatLimits(seconds=seconds))
        text = compiled[key].render(messages, generation_prompt, tools=tools, **variables)
        out = ["rendered", text]
    except ChatTemplateError as e:
        out = ["ChatTemplateError", str(e)]
    except MemoryError:
        out = ["MemoryError", ""]
    cpu, peak = time.process_time() - t, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps([name, *out, cpu, peak]), flush=True)
"""


# The time bound of a template that must stop at another bound: an hour, never reached.
AWAY = 3600.0
# CPU seconds a render may take past its time bound (or, with the time bound AWAY,
# in all): 10x the time bound of the hostile cases below; an honest stop takes
# milliseconds past the bound (the clock is read every CLOCK_EVERY steps).
CPU_SLACK = 5.0


def _in_child(cases: dict[str, tuple]) -> dict:
    """{name: (outcome, message or rendered text, CPU seconds, traced peak
    bytes)} of each case, given as {name: (template, time bound in seconds)}
    (rendered over HI) or {name: (template, time bound, messages, tools,
    special tokens, add_generation_prompt, variables)}. The child's wall
    limit only stops a render whose bound failed (honest: seconds in all)."""
    proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(cases), cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {row[0]: tuple(row[1:]) for row in map(json.loads, proc.stdout.splitlines())}
    assert set(got) == set(cases), proc.stderr[-3000:]
    return got


def test_the_issue_cases_stop_at_their_bounds_in_bounded_memory():
    """With the default limits: the counted bounds stop their cases in
    milliseconds, far inside the default 2 s; the endless loop meets the 2 s."""
    got = _in_child({name: (src, DEFAULT_SECONDS) for name, src in ISSUE_CASES.items()})
    for name, (kind, msg, cpu, peak) in got.items():
        assert kind == "ChatTemplateError", f"{name}: {kind} {msg}"
        assert msg.startswith(f"{KEY} stopped at its {ISSUE_BOUNDS[name]}"), f"{name}: {msg}"
        assert "\n" not in msg
        assert cpu < 10 * DEFAULT_SECONDS, f"{name}: {cpu:.1f} s of CPU"


HOSTILE = {   # template -> the bound it must stop at
    "{{ 'x'|center(3000000000) }}": "size bound",
    "{{ 'x'.ljust(3000000000) }}": "size bound",
    "{{ 'x'.zfill(3000000000) }}": "size bound",
    "{{ ('\t' * 1000)|string|replace('\t', 'y' * 10000) }}": "size bound",
    "{{ ('\t' * 1000).expandtabs(100000) }}": "size bound",
    "{{ ('a\n' * 1000)|indent(100000) }}": "size bound",
    "{{ '%999999999s' % 'a' }}": "size bound",
    "{{ '%*s' % (999999999, 'a') }}": "size bound",
    "{{ '{:>999999999}'.format('a') }}": "size bound",
    "{{ '{:>{w}}'.format('a', w=999999999) }}": "size bound",
    "{{ '%999999999s'|format('a') }}": "size bound",
    "{{ [1] * 3000000000 }}": "size bound",
    "{{ 7 ** 100000000 }}": "size bound",
    "{{ ('x' * 400000).replace('', 'yy') }}": "size bound",
    "{{ (['x' * 100000] * 100)|join }}": "size bound",
    "{{ ['x' * 100000] * 100 }}": "size bound",
    "{{ '-'.join(['x' * 100000] * 100) }}": "size bound",
    "{{ ('x' * 100000) ~ ('x' * 100000) ~ ('x' * 100000) ~ ('x' * 100000) ~ ('x' * 900000) }}":
        "size bound",
    "{{ range(10)|batch(3000000000, 'x')|list }}": "size bound",
    "{{ range(10)|slice(3000000000)|list }}": "size bound",
    "{{ lipsum(100000000) }}": "size bound",
    "{{ {'a': 'x' * 999999}|tojson(indent=100) }}": "size bound",
    "{% for a in range(99999) %}{% for b in range(99999) %}aaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "{% endfor %}{% endfor %}": "size bound",
    "{% set ns = namespace(l=[]) %}{% for i in range(99999) %}{% set ns.l = ns.l + ['x' * 9999 ~ i] %}"
    "{% endfor %}": "work bound",
    "{% for a in range(99999) %}{% for b in ('x' * 999999) %}{% endfor %}{% endfor %}": "time bound",
    "{% macro f() %}{% for x in range(99999) %}{{ caller() }}{% endfor %}{% endmacro %}"
    "{% call f() %}{{ 'x' * 100000 }}{% endcall %}": "work bound",
    "{% macro f() %}{{ caller() }}{% endmacro %}{% macro g() %}{% call f() %}{{ g() }}{% endcall %}"
    "{% endmacro %}{{ g() }}": "recursion bound",
    "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}": "recursion bound",
}


TIME_BOUND = 0.5    # the time bound of HOSTILE's endless loops (the default 2 s is the issue cases')


@pytest.fixture(scope="module")
def hostile_results():
    """Every HOSTILE template rendered in one child under the address-space
    limit: those that must stop at the time bound with TIME_BOUND, the others
    with the time bound AWAY."""
    return _in_child({source: (source, TIME_BOUND if bound == "time bound" else AWAY)
                      for source, bound in HOSTILE.items()})


@pytest.mark.parametrize("i", range(len(HOSTILE)))
def test_hostile_templates_stop_at_a_bound(hostile_results, i):
    source, bound = list(HOSTILE.items())[i]
    kind, msg, cpu, peak = hostile_results[source]
    assert kind == "ChatTemplateError", f"{source}: {kind}"
    assert msg.startswith(f"{KEY} stopped at its {bound}"), f"{source}: {msg}"
    assert peak < 96 << 20, f"{source}: {peak / 1e6:.0f} MB traced"
    assert cpu < (TIME_BOUND if bound == "time bound" else 0) + CPU_SLACK, f"{source}: {cpu:.1f} s"


def test_the_bounds_are_configurable():
    ten_k = ChatLimits(max_chars=10_000)
    with pytest.raises(ChatTemplateError, match="size bound.*over the bound of 10,000"):
        ChatTemplate("{{ 'x' * 20000 }}", {}, ten_k).render(HI)
    # a larger bound lets the same template through; so does one given per render
    assert len(ChatTemplate("{{ 'x' * 20000 }}", {}, ChatLimits(max_chars=30_000)).render(HI)) == 20000
    t = ChatTemplate("{{ 'x' * 2000000 }}", {})
    with pytest.raises(ChatTemplateError, match="size bound"):
        t.render(HI)
    assert len(t.render(HI, limits=ChatLimits(max_chars=3_000_000))) == 2_000_000
    # 3,000 loop steps (milliseconds) render within the default 2 s; 1e10 steps
    # never end but at the time bound given
    short = "{% for a in range(1000) %}{% for b in range(3) %}{% endfor %}{% endfor %}done"
    assert ChatTemplate(short, {}).render(HI) == "done"
    with pytest.raises(ChatTemplateError, match=r"time bound: more than 0.01 s of CPU"):
        ChatTemplate(ENDLESS, {}, ChatLimits(seconds=0.01)).render(HI)
    deep = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% else %}end{% endif %}{% endmacro %}{{ f(30) }}"
    assert ChatTemplate(deep, {}).render(HI) == "end"
    with pytest.raises(ChatTemplateError, match="recursion bound.*more than 10 deep"):
        ChatTemplate(deep, {}, ChatLimits(max_depth=10)).render(HI)


@pytest.mark.parametrize("bad", [dict(seconds=0), dict(seconds=float("inf")), dict(seconds="2"),
                                 dict(max_chars=0), dict(max_chars=1.5), dict(max_depth=True)])
def test_bad_limits_are_value_errors(bad):
    with pytest.raises(ValueError, match="chat template"):
        ChatLimits(**bad)


def test_long_conversations_get_a_bound_of_their_own_size():
    """The size bound grows with the messages: 3 MB of conversation renders
    by default, though 3 MB is past the 1 MB floor."""
    chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
              "{% endfor %}")
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "word " * 6000}
                for i in range(100)]
    out = ChatTemplate(chatml, {}).render(messages)
    assert len(out) > 3_000_000 and out.count("<|im_start|>") == 100


def test_a_stop_cannot_be_swallowed():
    """A template cannot catch the stop and carry on: every later hook
    repeats it, and the render reports it."""
    src = "{% for i in range(10) %}{{ ('x' * 3000000000) if i == 0 else '' }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="size bound"):
        ChatTemplate(src, {}).render(HI)


def test_a_constant_folded_while_compiling_is_bounded_too():
    # jinja2 computes filters of constants at compile time; the budget holds there
    # too, and the refusal then comes from the render
    with pytest.raises(ChatTemplateError, match="size bound"):
        ChatTemplate("{{ 'x'|center(3000000000) }}{{ messages }}", {}).render(HI)


@pytest.mark.parametrize("source", ["{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
                                    "{% if x %}" * 3000, "{{ x|no_such_filter }}"],
                         ids=["deep-parens", "deep-ifs", "unknown-filter"])
def test_templates_that_do_not_compile_are_chat_template_errors(source):
    with pytest.raises(ChatTemplateError, match=f"{KEY} does not compile"):
        ChatTemplate(source, {})


LONG_CHAT_TURNS = 64      # well past any template's few-turn cases; each turn costs every template


def _long_chat(rng: random.Random, turns: int) -> list[dict]:
    """A system message and ``turns`` alternating user and assistant
    messages of random words (non-ASCII, markup and braces among them)."""
    words = ["weather", "Zürich", "東京", "«ok»", "<b>", "{x}", "17", "%s", "'quote'", "line\n"]
    chat = [{"role": "system", "content": " ".join(rng.choices(words, k=20))}]
    for i in range(turns):
        chat.append({"role": "user" if i % 2 == 0 else "assistant",
                     "content": " ".join(rng.choices(words, k=rng.randint(1, 60)))})
    return chat


def test_the_template_corpus_renders_within_the_bounds():
    """Every template of the corpus (``chat_templates.TEMPLATES``, the
    families' formats among them), over the parity conversations with and
    without the generation prompt and over a random 64-turn chat, renders
    in the child under the default counted bounds (the time bound AWAY) to
    the text it renders unbounded by the child's limits; none stops at a
    bound, and a template's own refusal stays a 'failed to render'."""
    seed = random.SystemRandom().randrange(2**32)
    long_chat = _long_chat(random.Random(seed), LONG_CHAT_TURNS)
    cases = {}
    for name, source in TEMPLATES.items():
        for i, variables in enumerate(render_variables(name)):
            for conversation, (messages, tools) in CONVERSATIONS.items():
                for generation_prompt in (True, False):
                    cases[f"{name}[{i}] {conversation} {generation_prompt}"] = (
                        source, AWAY, messages, tools, special_tokens(name), generation_prompt,
                        variables)
            cases[f"{name}[{i}] long"] = (source, AWAY, long_chat, [WEATHER, SEARCH],
                                          special_tokens(name), True, variables)
    got = _in_child(cases)
    templates = {}
    for key, (kind, text, cpu, peak) in got.items():
        source, _, messages, tools, tokens, generation_prompt, variables = cases[key]
        where = f"{key} (seed {seed})"
        assert kind in ("rendered", "ChatTemplateError"), f"{where}: {kind}"
        assert peak < 96 << 20, f"{where}: {peak / 1e6:.0f} MB traced"
        assert cpu < CPU_SLACK, f"{where}: {cpu:.1f} s"
        if kind == "ChatTemplateError":
            assert text.startswith(f"{KEY} failed to render"), f"{where}: {text}"
            assert not key.endswith("long"), f"{where}: {text}"
            continue
        # the same render in this process, where nothing caps the memory
        compiled = (source, json.dumps(tokens))
        if compiled not in templates:
            templates[compiled] = ChatTemplate(source, tokens)
        assert text == templates[compiled].render(messages, generation_prompt, tools=tools,
                                                  **variables), where
    assert sum(kind == "rendered" for kind, *_ in got.values()) >= 0.7 * len(cases)
