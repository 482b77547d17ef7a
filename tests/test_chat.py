"""Chat templates rendered like transformers' apply_chat_template, byte for byte.

Expected strings: tests/fixtures/chat_templates_reference.json, written by
scripts/write_fixtures.py --only qwen2-real with transformers' tokenizer read from each GGUF
(Qwen2.5-Coder-0.5B-Instruct and SmolLM2-135M-Instruct; both are fetched, failing when they
cannot be).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cel_numpy.errors import PromptError, TokenizerError, UserError
from cel_numpy.models.chat import render_chat, special_token_variables
from cel_numpy.models.fetch import fetch
from cel_numpy.models.gguf_loader import open_gguf
from cel_numpy.models.tokenizer import BPETokenizer

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "chat_templates_reference.json").read_text("utf-8")
)


@pytest.fixture(scope="module", params=sorted(FIXTURE["models"]))
def model_case(request):
    """(name, tokenizer read from the fetched GGUF, the fixture's entry for it)."""
    name = request.param
    tokenizer = BPETokenizer.from_gguf_fields(open_gguf(fetch(name)))
    return name, tokenizer, FIXTURE["models"][name]


@pytest.mark.download
def test_templates_are_the_ones_the_fixture_was_written_from(model_case):
    name, tok, entry = model_case
    assert tok.chat_template, f"{name}: no chat template read from the GGUF"
    digest = hashlib.sha256(tok.chat_template.encode("utf-8")).hexdigest()
    assert digest == entry["template_sha256"], f"{name}: another template than the fixture's"


@pytest.mark.download
def test_render_equals_apply_chat_template_byte_for_byte(model_case):
    name, tok, entry = model_case
    variables = special_token_variables(tok)
    for key, value in variables.items():
        if key in entry["special_tokens"]:
            assert value == entry["special_tokens"][key], f"{name}: {key}"
    assert len(entry["cases"]) >= 8
    for case in entry["cases"]:
        ours = render_chat(
            tok.chat_template,
            case["messages"],
            add_generation_prompt=case["add_generation_prompt"],
            **variables,
        )
        assert ours == case["text"], f"{name}: {case['messages']!r}"


@pytest.mark.download
def test_qwen2_model_chat_and_ids(qwen2):
    text = qwen2.chat([{"role": "user", "content": "What is 48 plus 76?"}])
    assert text.endswith("<|im_start|>user\nWhat is 48 plus 76?<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n"), "Qwen's template adds its default system turn"
    ids = qwen2.encode_chat_text(text)
    tok = qwen2.tokenizer
    assert ids.count(tok.special_tokens["<|im_start|>"]) == 3
    assert ids.count(tok.special_tokens["<|im_end|>"]) == 2
    assert qwen2.decode(ids) == text


def test_raise_exception_is_a_one_line_prompt_error():
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    )
    assert render_chat(template, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(PromptError, match="refused this conversation: user first") as info:
        render_chat(template, [{"role": "system", "content": "x"}])
    assert "\n" not in str(info.value)


def test_the_sandbox_refuses_python_internals():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(UserError, match="SecurityError: access to attribute '__class__'") as info:
        render_chat(escape, [{"role": "user", "content": "x"}])
    assert "\n" not in str(info.value)
    ns = "{% set n = namespace(_secret=1) %}{{ n }}"
    with pytest.raises(UserError, match="cannot store underscore attributes on a namespace"):
        render_chat(ns, [{"role": "user", "content": "x"}])


def test_hf_globals_and_filters():
    template = (
        "{{ messages | tojson }}|{{ dict(a=1) | tojson }}|{% for m in messages %}"
        "{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
        "{% generation %}{{ add_generation_prompt }}{% endgeneration %}|{{ bos_token }}"
    )
    messages = [{"role": "user", "content": "<b>é</b>"}, {"role": "assistant", "content": "y"}]
    out = render_chat(template, messages, add_generation_prompt=True, bos_token="<s>")
    assert out == (
        '[{"role": "user", "content": "<b>é</b>"}, {"role": "assistant", "content": "y"}]'
        '|{"a": 1}|user|True|<s>'
    )  # tojson keeps HTML and non-ASCII as they are (HF's filter, not jinja2's)


def test_bad_template_and_bad_messages_are_one_line():
    with pytest.raises(TokenizerError, match="does not parse"):
        render_chat("{% if %}", [])
    with pytest.raises(PromptError, match="list of"):
        render_chat("x", "hello")
    with pytest.raises(PromptError, match="message 0"):
        render_chat("x", [{"content": "no role"}])
