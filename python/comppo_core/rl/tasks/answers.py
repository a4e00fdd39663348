"""Is a response's final answer the reference answer? The answer check of the file tasks.

One rule, used by the JSONL task's verifier (:mod:`comppo_core.rl.tasks.jsonl`) and, as the
built-in reward :func:`math_answer`, by saved Hugging Face datasets
(:mod:`comppo_core.rl.tasks.hf_dataset`). Two comparisons implement it:

**math-verify** (``method="math-verify"``; what ``"auto"`` uses when ``math_verify`` is
importable — the ``[rl]`` extra installs it), the verifier of open-r1's and TRL's examples:

1. *reference*: the answer's text after its last ``"####"`` or ``"answer:"`` marker
   (case-insensitive) when it has one (a GSM8K-style answer column), else the whole answer;
   parsed with ``math_verify.parse``; when that finds no expression and the reference has no
   letters outside LaTeX commands (``\\{1,2\\}``, ``[0,1)``, ``\\sqrt{2}``), it is parsed again
   inside ``$...$``. A reference in which math-verify still finds nothing (a word: ``Paris``,
   ``A``, ``yes``) is compared by the hand rule below;
2. *prediction*: the response's text after its last marker, else the whole response (the
   last :data:`MAX_CHARS` characters of it); when it equals the reference after
   :func:`normalize`, a match; else parsed with ``math_verify.parse`` (its own LaTeX and
   expression extraction: ``\\boxed{}`` first, then the last expression);
3. ``math_verify.verify(reference, prediction)``: numeric equality to 6 decimals,
   symbolic equality, sets, intervals, ``%``.

**The hand rule** (``method="hand"``; ``"auto"`` without math-verify, and the text answers
of step 1): :func:`extract_answer` — the text after the last marker, else the last number
of the response, else the whole response — compared by :func:`answers_match`: the exact
rational values when both sides parse as numbers (:func:`parse_number`: ``72`` = ``72.0`` =
``$72`` = ``1,234``-style separators = ``144/2``), else the texts after :func:`normalize`.

The two differ (the table in ``docs/answers.md``, pinned by ``tests/rl/test_answers.py``):
math-verify reads LaTeX (``\\frac{1}{2}`` = ``0.5``, ``\\boxed{}``), sets and intervals,
``50%`` = ``0.5``, and rounds to 6 decimals (``0.333333`` = ``1/3``); it does not read
exponent notation (``1e3`` ≠ ``1000``) and reads a comma between single digits as a
decimal comma (``1,2,3`` is 1.2); the hand rule is exact and reads neither LaTeX nor sets.

**Time.** math-verify costs about 1.6 ms a response (64 typical responses, docs/answers.md;
the first call imports sympy, about 1 s), the hand rule about 0.02 ms. sympy can take
unbounded time on some inputs (``9^9^9^9``, ``9^{99999999}``, ``\\binom{10^8}{...}``), so:

* a text whose exponent, factorial or binomial could be huge (:func:`math_verify_safe`: a
  power tower, or such an operator beside an integer of 7 or more digits) is never given
  to math-verify: the hand rule decides for it, in every thread (verdicts do not depend on
  where the check runs);
* math-verify's own signal-based timeouts (:data:`PARSE_TIMEOUT_S`, :data:`VERIFY_TIMEOUT_S`;
  an input over them is not a match) are used only where ``signal.alarm`` is safe: POSIX,
  the main thread, and no ``ITIMER_REAL`` timer already pending (which they would cancel).
  Elsewhere (worker threads, Windows, where math-verify's timeout would spawn a process per
  call) they are off, and the screen above is the guard; the log line math-verify writes
  when its timeouts are off (``"Timeout is disabled ..."``) is filtered from its loggers.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import signal
import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from ...errors import ParameterError

__all__ = [
    "MAX_CHARS",
    "METHODS",
    "PARSE_TIMEOUT_S",
    "VERIFY_TIMEOUT_S",
    "answer_check",
    "answers_match",
    "extract_answer",
    "is_correct",
    "marker_tail",
    "math_answer",
    "math_verify_available",
    "math_verify_safe",
    "normalize",
    "parse_number",
]

#: The comparisons :func:`is_correct` can use; ``"auto"`` is math-verify when importable.
METHODS = ("auto", "math-verify", "hand")
#: math-verify reads at most the last this many characters of a response.
MAX_CHARS = 4000
#: math-verify's timeouts in seconds (its parse, each comparison), where they are safe.
PARSE_TIMEOUT_S = 2
VERIFY_TIMEOUT_S = 2

_MARKER = re.compile(r"####|answer:", re.IGNORECASE)
_NUMBER_IN_TEXT = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?(?:/\d+)?|[-+]?\.\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:/\d+)?")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
# an exponent operator whose operand holds another (9^9^9, 9^{9^{9}}, 2**(3**4)): a power tower
_TOWER = re.compile(r"(?:\^|\*\*)\s*(?:[-+]?\s*[\w.]+\s*|\{[^{}]*|\([^()]*)(?:\^|\*\*)")
_GROWTH = re.compile(r"\^|\*\*|!|binom|choose|factorial")
_BIG_INTEGER = re.compile(r"\d{7,}")


# ---------------------------------------------------------------------------------------------------------
# the hand rule


def normalize(text: str) -> str:
    """Strip, collapse whitespace runs to one space, drop one trailing ``.``."""
    out = " ".join(str(text).split())
    return out[:-1].rstrip() if out.endswith(".") else out


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number written as ``text`` (after :func:`normalize`), or None.

    Integers, decimals, exponents and ``a/b``; ``,`` separators and one leading ``$`` (after
    the sign) are allowed: ``"-$1,234.50"`` is −1234.5."""
    s = normalize(text).replace(",", "")
    sign = ""
    if s and s[0] in "+-":
        sign, s = s[0], s[1:]
    s = s[1:] if s.startswith("$") else s
    s = sign + s
    if not _NUMBER.fullmatch(s):
        return None
    try:
        if "/" in s:
            num, den = s.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def marker_tail(text: str) -> str | None:
    """The text after the last ``"####"`` or ``"answer:"`` (case-insensitive), or None without one."""
    markers = list(_MARKER.finditer(text))
    return text[markers[-1].end() :] if markers else None


def extract_answer(response: str) -> str:
    """The hand rule's final answer of ``response``, not yet normalised: the text after the
    last marker; without one, the last number; without a number, the whole response."""
    tail = marker_tail(response)
    if tail is not None:
        return tail
    numbers = _NUMBER_IN_TEXT.findall(response)
    return numbers[-1] if numbers else response


def answers_match(predicted: str, reference: str) -> bool:
    """The hand comparison: exact values when both parse as numbers, else the normalised texts."""
    p, r = parse_number(predicted), parse_number(reference)
    if p is not None and r is not None:
        return p == r
    return normalize(predicted) == normalize(reference)


def _reference(answer: str) -> str:
    tail = marker_tail(answer)
    return answer if tail is None else tail


def _hand(response: str, answer: str) -> bool:
    return answers_match(extract_answer(response), _reference(answer))


# ---------------------------------------------------------------------------------------------------------
# math-verify


def math_verify_available() -> bool:
    """Whether ``math_verify`` imports (the ``[rl]`` extra installs it)."""
    return _import_math_verify() is not None


def answer_check() -> str:
    """What decides an answer here, for a task's ``to_dict``: ``"math-verify X.Y.Z"`` when it
    imports, else ``"hand"`` (the fallback rule)."""
    if not math_verify_available():
        return "hand"
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"math-verify {version('math-verify')}"
    except PackageNotFoundError:  # importable but not installed as a distribution (a source tree)
        return "math-verify"


def _import_math_verify() -> Any:
    try:  # imported on each call (a dict lookup once loaded), so a test can make it unimportable
        math_verify = importlib.import_module("math_verify")
    except ImportError:
        return None
    _quiet_disabled_timeout_notice()
    return math_verify


class _DropDisabledTimeoutNotice(logging.Filter):
    """Drops math-verify's "Timeout is disabled" notice: this module turns its timeouts off on
    purpose where signals are unsafe (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


_NOTICE_FILTER = _DropDisabledTimeoutNotice()


def _quiet_disabled_timeout_notice() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if _NOTICE_FILTER not in logger.filters:
            logger.addFilter(_NOTICE_FILTER)


def _timeouts() -> tuple[int | None, int | None]:
    """(parse, verify) timeouts where ``signal.alarm`` is safe, else (None, None)."""
    safe = (
        os.name == "posix"
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    )
    return (PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S) if safe else (None, None)


def math_verify_safe(text: str) -> bool:
    """False for a text sympy could spend unbounded time on: a power tower (an exponent
    operator ``^``/``**`` inside another's operand), or an exponent, factorial or binomial
    with an integer of 7 or more digits in the text (``9^{99999999}``, ``\\binom{10000000}{2}``).
    A heuristic screen (module docstring); math-verify's timeouts back it where they are safe."""
    if _TOWER.search(text):
        return False
    return not (_GROWTH.search(text) and _BIG_INTEGER.search(text))


def _parse_reference(mv: Any, reference: str, timeout: int | None) -> list[Any]:
    gold: list[Any] = mv.parse(reference, parsing_timeout=timeout)
    if not gold and "$" not in reference and not re.search(r"[A-Za-z]", _LATEX_COMMAND.sub("", reference)):
        gold = mv.parse(f"${reference}$", parsing_timeout=timeout)
    return gold


def _math_verify(mv: Any, response: str, answer: str) -> bool:
    reference = _reference(answer)
    tail = marker_tail(response)
    prediction = (response if tail is None else tail)[-MAX_CHARS:]
    if normalize(prediction) == normalize(reference):  # the same text is the same answer
        return True
    if not (math_verify_safe(reference) and math_verify_safe(prediction)):
        return _hand(response, answer)
    parse_timeout, verify_timeout = _timeouts()
    gold = _parse_reference(mv, reference, parse_timeout)
    if not gold:  # a word, not an expression: the hand rule's text comparison
        return _hand(response, answer)
    pred = mv.parse(prediction, parsing_timeout=parse_timeout)
    return bool(mv.verify(gold, pred, timeout_seconds=verify_timeout))


# ---------------------------------------------------------------------------------------------------------
# the check and the reward


def is_correct(response: str, answer: str, *, method: str = "auto") -> bool:
    """Whether ``response``'s final answer is ``answer`` (module docstring).

    Args:
      response: the model's text.
      answer: the reference answer (a GSM8K-style ``"... #### 72"`` reads as ``72``).
      method: ``"auto"`` (math-verify when importable, else the hand rule), ``"math-verify"``
        (a ParameterError naming ``method`` when it is not installed) or ``"hand"``.
    """
    if method not in METHODS:
        raise ParameterError(f"method: expected one of {list(METHODS)}, got {method!r}", argument="method")
    response, answer = str(response), str(answer)
    mv = None if method == "hand" else _import_math_verify()
    if mv is None:
        if method == "math-verify":
            raise ParameterError(
                "method: 'math-verify' needs the math-verify package: pip install 'comppo-core[rl]' (or math-verify)",
                argument="method",
            )
        return _hand(response, answer)
    return _math_verify(mv, response, answer)


def _text(completion: Any) -> str:
    """A TRL completion's text: a string, or a conversation (its last message's ``content``)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ParameterError(
        f"completions: expected strings or lists of messages with 'content', got {type(completion).__name__}",
        argument="completions",
    )


def math_answer(completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> list[float]:
    """A reward function (TRL's signature): 1.0 where :func:`is_correct` (``"auto"``), else 0.0.

    ``completions``: text completions, or conversations (the last message's ``content``);
    ``answer``: the reference of each, the dataset's ``answer`` column; other columns are
    ignored. The saved-dataset task's spec names it ``"comppo_core.rl.tasks.answers:math_answer"``
    (the task gives 0.0 itself to a response that did not stop at EOS)."""
    if len(completions) != len(answer):
        raise ParameterError(
            f"answer: expected one per completion ({len(completions)}), got {len(answer)}", argument="answer"
        )
    return [1.0 if is_correct(_text(c), "" if a is None else str(a)) else 0.0 for c, a in zip(completions, answer)]
