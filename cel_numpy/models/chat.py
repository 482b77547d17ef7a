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

Limits. A template is code from a download, so rendering is bounded in time, memory and output
(`TemplateLimits`; the sandbox already refuses Python internals): the `*`, `**`, `+` and `%`
operators are intercepted (which also stops jinja2 from evaluating `10 ** 10 ** 9` while it
compiles) and refuse results past `max_value` characters/items or `max_int_bits` bits; string
widths (`center`, `ljust`, `format` fields, `%` specs, `indent`, `tojson(indent=...)`) and the
filters and methods that multiply text (`replace`, `join`, `batch`, `expandtabs`) are checked
before they run; every value a call, a filter or a namespace assignment produces is measured;
every `for` loop and call checks a deadline of `seconds`; the rendered text may hold at most
`max_rendered` characters. Any failure of a template (a limit, a syntax error, `1/0`,
`{% include %}`, runaway recursion) is one line naming the model file, exit status 2.

    text = render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from cel_numpy.errors import PromptError, TokenizerError


@dataclass(frozen=True)
class TemplateLimits:
    """What one render of a chat template may use (real templates need a tiny fraction)."""

    max_template: int = 200_000  # characters of template source
    max_value: int = 1_000_000  # characters (or items) of any value built while rendering
    max_int_bits: int = 65_536  # bits of an integer built by * or **
    max_rendered: int = 1_000_000  # characters of rendered text
    seconds: float = 10.0  # wall time of one render


LIMITS = TemplateLimits()
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)


class TemplateLimitError(Exception):
    """A template went past one of LIMITS (raised inside the sandbox, reported by render_chat)."""


@functools.cache
def _refusal_class():
    import jinja2

    class TemplateRefusal(jinja2.exceptions.TemplateError):
        """`raise_exception(message)`: the template refuses the conversation (transformers
        raises jinja2's TemplateError the same way)."""

    return TemplateRefusal


def _check_deadline() -> None:
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimitError(f"rendering took longer than {LIMITS.seconds:g} s")


def value_size(value, budget: int | None = None) -> int:
    """Characters and items in `value`, counting nested containers and shared references
    (what printing it would write, roughly); stops counting once past `budget`."""
    budget = LIMITS.max_value if budget is None else budget
    total, stack = 0, [value]
    while stack and total <= budget:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, dict):
            total += 1 + len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 1 + len(v)
            stack.extend(v)
        else:
            total += 1
    return total


def _check_size(value, what: str):
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > LIMITS.max_int_bits:
            raise TemplateLimitError(
                f"{what} made an integer of more than {LIMITS.max_int_bits} bits"
            )
    elif value_size(value) > LIMITS.max_value:
        raise TemplateLimitError(
            f"{what} made a value of more than {LIMITS.max_value:,} characters"
        )
    return value


def _refuse_if(too_big: bool, what: str) -> None:
    if too_big:
        raise TemplateLimitError(f"{what} would make more than {LIMITS.max_value:,} characters")


def _check_binop(operator: str, left, right) -> None:
    """Refuse, before computing it, an operation whose result would pass the limits."""
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
    if operator == "**" and ints and right > 0 and abs(left) > 1:
        if right * left.bit_length() > LIMITS.max_int_bits:
            raise TemplateLimitError(f"{left} ** {right} has more than {LIMITS.max_int_bits} bits")
    elif operator == "*" and ints:
        if left.bit_length() + right.bit_length() > LIMITS.max_int_bits:
            raise TemplateLimitError(f"a product of more than {LIMITS.max_int_bits} bits")
    elif operator == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(n, int) and isinstance(seq, (str, list, tuple)):
            _refuse_if(n > 0 and n * value_size(seq) > LIMITS.max_value, "repeating a value")
    elif operator == "+" and all(isinstance(x, (str, list, tuple)) for x in (left, right)):
        _refuse_if(value_size(left) + value_size(right) > LIMITS.max_value, "+")
    elif operator == "%" and isinstance(left, str):
        _check_format(left, _format_values(right), "%")


_NUMBER = re.compile(r"\d+")


def _check_format(fmt: str, values: list, what: str) -> None:
    """A format string (str.format fields or %-specs) and its arguments must not ask for a width
    over max_value or repeat large arguments into a result over max_value."""
    if any(int(d) > LIMITS.max_value for d in _NUMBER.findall(fmt)):
        raise TemplateLimitError(f"{what}: a width or precision over {LIMITS.max_value:,}")
    if "*" in fmt or re.search(r"\{[^{}]*\{", fmt):  # widths taken from the arguments
        if any(isinstance(v, int) and abs(v) > LIMITS.max_value for v in values):
            raise TemplateLimitError(f"{what}: a width or precision over {LIMITS.max_value:,}")
    fields = fmt.count("{") + fmt.count("%")
    largest = max((value_size(v) for v in values), default=0)
    _refuse_if(len(fmt) + fields * largest > LIMITS.max_value, what)


def _format_values(right) -> list:
    """The arguments of `fmt % right` as a list."""
    if isinstance(right, tuple):
        return list(right)
    if isinstance(right, dict):
        return list(right.values())
    return [right]


def _check_str_method(name: str, text: str, args, kwargs) -> None:
    """Pre-checks for the str methods that can multiply text."""
    if name == "format":
        _check_format(text, list(args) + list(kwargs.values()), name)
    elif name == "format_map" and args and isinstance(args[0], dict):
        _check_format(text, list(args[0].values()), name)
    elif name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        _refuse_if(args[0] > LIMITS.max_value, name)
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _refuse_if(text.count("\t") * size > LIMITS.max_value, name)
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        _check_replace(text, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        _check_join(text, args[0])


def _check_replace(text: str, old: str, new: str, count) -> None:
    n = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    _refuse_if(len(text) + n * len(new) > LIMITS.max_value, "replace")


def _check_join(separator, items) -> None:
    if isinstance(items, (list, tuple, str)):
        n = len(items)
        _refuse_if(value_size(items) + n * len(str(separator)) > LIMITS.max_value, "join")


def _limited_filter(name: str, function):
    """A jinja2 filter with the deadline, a pre-check of its size arguments, and its result
    measured."""

    @functools.wraps(function)
    def limited(*args, **kwargs):
        _check_deadline()
        _check_filter_arguments(name, args, kwargs)
        return _check_size(function(*args, **kwargs), f"the filter {name}")

    return limited


def _check_filter_arguments(name: str, args, kwargs) -> None:
    # contextfilters / environmentfilters get the context first: the value is the first str/list
    values = [a for a in args if not hasattr(a, "environment") and not hasattr(a, "filters")]
    value = values[0] if values else None
    rest = values[1:]
    numbers = [a for a in rest + list(kwargs.values()) if isinstance(a, int)]
    if name in ("center", "indent", "wordwrap", "truncate", "batch", "slice", "tojson", "urlize"):
        widths = numbers + [kwargs.get("width", 0), kwargs.get("indent", 0) or 0]
        if any(isinstance(w, int) and abs(w) > LIMITS.max_value for w in widths):
            raise TemplateLimitError(f"the filter {name}: a size over {LIMITS.max_value:,}")
    if name == "indent" and isinstance(value, str):
        width = rest[0] if rest else kwargs.get("width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _refuse_if((value.count("\n") + 1) * pad + len(value) > LIMITS.max_value, "indent")
    elif name == "tojson":
        indent = rest[1] if len(rest) > 1 else kwargs.get("indent")
        if isinstance(indent, int) and indent > 64:
            raise TemplateLimitError("the filter tojson: indent over 64")
    elif name == "replace" and len(rest) >= 2 and isinstance(value, str):
        count = rest[2] if len(rest) > 2 else kwargs.get("count", -1)
        if all(isinstance(a, str) for a in rest[:2]):
            _check_replace(value, str(rest[0]), str(rest[1]), count)
    elif name == "join" and value is not None:
        _check_join(rest[0] if rest else kwargs.get("d", ""), value)
    elif name == "format" and isinstance(value, str):
        _check_format(value, rest + list(kwargs.values()), "the filter format")
    elif name in ("batch", "slice") and isinstance(value, (list, tuple, str)) and rest:
        if isinstance(rest[0], int):
            _refuse_if(rest[0] * (1 + len(value)) > LIMITS.max_value, f"the filter {name}")


def _loop_guard(iterable):
    """What every `for` loop iterates: the deadline is checked at each step."""
    for item in iterable:
        _check_deadline()
        yield item


@functools.lru_cache(maxsize=8)
def compile_template(template: str):
    """A jinja2 template compiled in transformers' sandboxed chat environment, with LIMITS
    (cached). Raises TemplateLimitError or jinja2's errors; render_chat reports them."""
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if len(template) > LIMITS.max_template:
        raise TemplateLimitError(
            f"the template is {len(template):,} characters, more than {LIMITS.max_template:,}"
        )

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
        """jinja2's namespace, refusing underscore attributes (no route to Python internals)
        and values past the size limit (a value doubled at each loop step)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name, value in attrs.items():
                TemplateNamespace._check(name, value)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name, value)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name, value):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore attributes on a namespace: {name!r}"
                )
            _check_deadline()
            _check_size(value, "a namespace assignment")

    class TemplateDict:
        """`dict(...)` and `dict.fromkeys(...)` for templates, without the class itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox with LIMITS: operators, calls and loops checked (see the module doc)."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context, operator, left, right):
            _check_deadline()
            _check_binop(operator, left, right)
            return _check_size(super().call_binop(context, operator, left, right), operator)

        def call(__self, __context, __obj, *args, **kwargs):  # names as jinja2: no clash
            _check_deadline()
            target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            owner = getattr(target, "__self__", None)
            if isinstance(owner, str):
                _check_str_method(getattr(target, "__name__", ""), owner, args, kwargs)
            for value in (*args, *kwargs.values()):  # a macro recursing on a doubled value
                _check_size(value, "an argument")
            result = super().call(__context, __obj, *args, **kwargs)
            return _check_size(result, "a call")

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Call(
                    nodes.Name("cel_numpy_loop_guard", "load"), [loop.iter], [], None, None
                ).set_lineno(loop.lineno)
            return tree

    def raise_exception(message):
        raise _refusal_class()(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = LimitedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.filters = {name: _limited_filter(name, f) for name, f in env.filters.items()}
    env.globals.pop("lipsum", None)  # lorem ipsum of any length: no chat template uses it
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    env.globals["cel_numpy_loop_guard"] = _loop_guard
    return env.from_string(template)


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
    where: str = "",
    **variables,
) -> str:
    """The conversation as the template writes it (same text as transformers' apply_chat_template).

    variables: the tokenizer's special tokens as text (bos_token="<|endoftext|>", ...) and any
    extra template variable. where: the file the template came from, named in errors.
    A template that refuses the conversation (raise_exception) gives a one-line PromptError with
    the template's message; any other failure (a syntax error, an error while rendering, a
    limit of TemplateLimits) a one-line TokenizerError.
    """
    import jinja2

    refusal = _refusal_class()
    prefix = f"{where}: " if where else ""
    if not isinstance(template, str):
        raise TokenizerError(
            f"{prefix}the chat template is a {type(template).__name__}, not a string: "
            "the model file is damaged"
        )
    messages = check_messages(messages)
    try:
        compiled = compile_template(template)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise TokenizerError(
            f"{prefix}the chat template does not parse (line {err.lineno}: {err.message}); "
            "the tokenizer files are damaged or the template is not jinja2"
        ) from None
    except Exception as err:  # a limit, or the compiler's own recursion on deep nesting
        raise TokenizerError(f"{prefix}the chat template does not compile ({_why(err)})") from None
    token = _DEADLINE.set(time.monotonic() + LIMITS.seconds)
    try:
        chunks, total = [], 0
        for chunk in compiled.generate(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        ):
            total += len(chunk)
            if total > LIMITS.max_rendered:
                raise TemplateLimitError(
                    f"the rendered text passes {LIMITS.max_rendered:,} characters"
                )
            _check_deadline()
            chunks.append(chunk)
        return "".join(chunks)
    except refusal as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PromptError(f"{prefix}the chat template refused this conversation: {first}") from None
    except Exception as err:  # templates are code from a download: any failure is theirs
        raise TokenizerError(
            f"{prefix}the chat template failed ({_why(err)}); the template is damaged or "
            "hostile: use the model's original files"
        ) from None
    finally:
        _DEADLINE.reset(token)


def _why(err: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    if isinstance(err, RecursionError):
        return "RecursionError: nested or recursive too deeply"
    if isinstance(err, MemoryError):
        return "MemoryError: out of memory"
    text = str(err).splitlines()[0] if str(err) else ""
    if isinstance(err, TemplateLimitError):
        return f"over a limit: {text}"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


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
