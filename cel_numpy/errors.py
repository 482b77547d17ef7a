"""The errors cel-numpy raises for bad input: one line each, naming what is wrong and what to do.

    UserError                          anything the user can fix; `cel-numpy` prints
    |                                  "cel-numpy CMD: error: <message>" and exits with status 2
    +-- ModelFileError                 a model or tokenizer file is missing, damaged or unsupported;
    |   |                              the message starts with the file's path
    |   +-- TokenizerError (ValueError)          tokenizer files
    +-- ConfigError (ValueError)       a model configuration the forward cannot run
    +-- FetchError (RuntimeError)      a registry download failed or did not verify
    +-- OptionError (ValueError)       an option or argument value: head specs, task and model
    |                                  names, panel sizes, --out; raised before any work
    +-- PromptError (ValueError)       text a model cannot take: empty, longer than the context,
    |                                  not valid Unicode
    +-- RunDirError                    a run directory that does not validate, or is locked
    +-- InvalidHeadError (ValueError)  an ablation names a head the model does not have
    +-- NoTokenizerError (RuntimeError)  text given to a model loaded without tokenizer files
    +-- DivergenceError (FloatingPointError)  training diverged (a learning rate too large)
    +-- NonFiniteError (FloatingPointError)  a forward pass produced NaN or Inf logits
    +-- WorkerError                    a worker process died (e.g. the out-of-memory killer);
                                       rerunning resumes

Every class lives here, so any module can raise them without importing another layer (the
modules that raise them also re-export them under their old import paths).

The second base classes keep older `except ValueError` / `except RuntimeError` callers working.
Anything else escaping to the command line is a bug: it is reported as an internal error
(exit status 1) with a hint to rerun with `--debug`, which prints the traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit status 2, no traceback."""


class ModelFileError(UserError):
    """A model or tokenizer file is missing, truncated, corrupt or unsupported (names the file)."""


class OptionError(UserError, ValueError):
    """A command-line option or API argument with an impossible value (checked before any work)."""


class PromptError(UserError, ValueError):
    """A prompt the model cannot take: empty, longer than the context window, or not valid text."""


def one_line(message: str) -> str:
    """Collapse a message onto one line (an error line must never spill into several)."""
    return " ".join(str(message).split())


def safe_text(text: str, stream=None) -> str:
    """`text` as `stream` (default: stdout) can print it, never raising: the undecodable bytes
    of a non-UTF-8 file name (which Python keeps as lone surrogates) become U+FFFD, and what the
    stream's encoding cannot represent becomes its replacement character."""
    import sys

    text = str(text)
    encoding = getattr(stream if stream is not None else sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        pass
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # surrogates that are not escaped bytes
        text = text.encode("utf-8", "replace").decode("utf-8")
    try:
        return text.encode(encoding, "replace").decode(encoding)
    except LookupError:
        return text


class TokenizerError(ModelFileError, ValueError):
    """A tokenizer file is malformed or uses a feature we do not support (one-line message)."""


class ConfigError(UserError, ValueError):
    """A configuration that the forward cannot run (one line, names the offending field)."""


class FetchError(UserError, RuntimeError):
    """A registry file could not be obtained or failed verification (one-line message)."""


class RunDirError(UserError):
    """Something in the run directory does not validate (one line; names the file)."""


class InvalidHeadError(UserError, ValueError):
    """An ablation names a head the model does not have (one-line message)."""


class NoTokenizerError(UserError, RuntimeError):
    """Text was given to a model loaded without tokenizer files."""


class WorkerError(UserError):
    """A worker process of `localize --workers N` died from outside; the run resumes when rerun."""


class DivergenceError(UserError, FloatingPointError):
    """Gradient descent diverged (non-finite or exploding loss): the learning rate is too large."""


class NonFiniteError(UserError, FloatingPointError):
    """A forward pass produced NaN or Inf logits: an error, never a score."""
