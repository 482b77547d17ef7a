"""Chat templates: a model's own jinja2 template turned into the text the model was tuned on.

Instruction-tuned models expect a conversation written in their own format, e.g. Qwen2's and
SmolLM2's ChatML:

    <|im_start|>system
    You are a helpful assistant.<|im_end|>
    <|im_start|>user
    What is 48 plus 76?<|im_end|>
    <|im_start|>assistant

The format is a jinja2 template shipped with the model (GGUF: `tokenizer.chat_template`;
Hugging Face folders: `chat_template` in tokenizer_config.json, or chat_template.jinja). We render
it the way transformers' `apply_chat_template` does, so the strings are byte-for-byte equal:

  * an `ImmutableSandboxedEnvironment` (templates are code from a download; the sandbox refuses
    attribute access to Python internals and mutation of the arguments) with trim_blocks=True,
    lstrip_blocks=True and the loop-control extension (`{% break %}`, `{% continue %}`);
  * the same globals: `raise_exception(msg)`, `strftime_now(fmt)`, a `dict` constructor and a
    `namespace` that refuses underscore attributes; a `tojson` filter that does not escape HTML
    (json.dumps with ensure_ascii=False); a `{% generation %}` block that renders its body;
  * the same variables: `messages`, `tools`, `documents`, `add_generation_prompt`, and the
    tokenizer's special tokens as text (`bos_token`, `eos_token`, `pad_token`, `unk_token`).

    text = render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime

from cel_numpy.errors import PromptError, TokenizerError


@functools.lru_cache(maxsize=8)
def compile_template(template: str):
    """A jinja2 template compiled in transformers' sandboxed chat environment (cached)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: renders its body (HF marks it for masks)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller):
            return caller()

    class TemplateNamespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing underscore attributes (no route to Python internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore attributes on a namespace: {name!r}"
                )

    class TemplateDict:
        """`dict(...)` and `dict.fromkeys(...)` for templates, without the class itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise TokenizerError(
            f"the chat template does not parse (line {err.lineno}: {err.message}); "
            "the tokenizer files are damaged or the template is not jinja2"
        ) from None


def check_messages(messages) -> list[dict]:
    """A list of {"role": str, "content": ...} dicts (copied), or a PromptError."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise PromptError(
            'messages must be a list of {"role": ..., "content": ...} dicts, '
            f"got {type(messages).__name__}"
        )
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptError(f"message {i} must be a dict with a string 'role', got {message!r}")
        out.append(dict(message))
    return out


def render_chat(
    template: str,
    messages,
    *,
    add_generation_prompt: bool = False,
    tools: list | None = None,
    documents: list | None = None,
    **variables,
) -> str:
    """The conversation as the template writes it (same text as transformers' apply_chat_template).

    variables: the tokenizer's special tokens as text (bos_token="<|endoftext|>", ...) and any
    extra template variable. A template that refuses the conversation (raise_exception) gives a
    one-line PromptError with the template's message.
    """
    import jinja2

    compiled = compile_template(template)
    try:
        return compiled.render(
            messages=check_messages(messages),
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.exceptions.TemplateError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PromptError(f"the chat template refused this conversation: {first}") from None


def special_token_variables(tokenizer) -> dict[str, str]:
    """bos_token / eos_token / pad_token / unk_token as text, for the tokens the tokenizer has.

    transformers passes the tokenizer's special_tokens_map to the template the same way.
    """
    out = {}
    for name in ("bos", "eos", "pad", "unk"):
        idx = getattr(tokenizer, f"{name}_id", None)
        if idx is not None:
            out[f"{name}_token"] = tokenizer.decode([idx])
    return out
