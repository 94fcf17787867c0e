"""A value exercise's answer, read in the forms people write it, then compared with the value the check derives.

``read(answer, expected, byte_count=...)`` gives a ``Reading``: the answer as the check understands it, or why it
cannot (``Reading.problem``, a form the check does not read: the verdict says which form is wanted and the attempt is
not counted). What is read:

- a number, exactly: ``675928``, ``675928.0``, a numpy value, a one-row Series, a string ``"675928"``, with thousands
  grouped (``"675,928"``, ``"675 928"``, ``"675_928"``), or with the word ``bytes`` (``"675928 bytes"``);
- a number at the precision written: a decimal point, an exponent or a unit that scales (``"6.76e5"``,
  ``"6.759280e+05"``, ``"660 KiB"``, ``"0.645 MiB"``) agrees when the value, in that unit, rounds to it; with fewer than
  ``MIN_DIGITS`` significant digits (``"7e5"``) the answer is too coarse to tell a right number from a near miss, and
  the verdict asks for more. Binary units (KiB, MiB, GiB: powers of 1024) and decimal ones (KB, MB, GB: powers of
  1000) are told apart, and the verdict says how it read them. Units are for answers that count bytes; any other
  answer (a count) may carry a word (``"3 buckets"``) but not a unit of bytes;
- a name, case and spaces aside (``"fsdp2 FP32"`` is ``"FSDP2 fp32"``);
- a tuple or list in any spacing and brackets (``(1, 12)``, ``"(1,12)"``, ``"[1, 12]"``, ``"1, 12"``), each value read
  as above.

Full-width characters (``（1，12）``, ``６７５９２８``) are read as their ASCII forms (NFKC).
"""

from __future__ import annotations

import math
import numbers
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from ..i18n import Message, Nn_

MIN_DIGITS = 3  # significant digits an answer given at a precision must have: "7e5" is too coarse, "6.76e5" is not
# Units of bytes, by their lower-case spelling: (the unit as shown, bytes per unit).
BYTE_UNITS = {"b": ("bytes", 1), "byte": ("bytes", 1), "bytes": ("bytes", 1),
              "kib": ("KiB", 2**10), "mib": ("MiB", 2**20), "gib": ("GiB", 2**30),
              "kb": ("KB", 10**3), "mb": ("MB", 10**6), "gb": ("GB", 10**9)}
_GROUPED = r"\d{1,3}(?:[,_ ]\d{3})+"  # 675,928 / 675 928 / 675_928 (groups of three only: "1,12" is a pair)
_NUMBER = re.compile(rf"(?P<sign>[-+]?)(?P<whole>{_GROUPED}|\d+)?(?P<frac>\.\d+)?(?P<exp>[eE][-+]?\d+)?"
                     r"\s*(?P<word>[^\W\d_]+)?")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class Reading:
    """An answer as the check reads it.

    Attributes:
        given: the answer as written (shown back to the learner).
        exact: the value to compare exactly (a number, a name folded to lower case without spaces), or ``None``.
        number: a number read at its precision (``Decimal("6.76E+5")``, in ``unit``), or ``None``.
        unit: the unit ``number`` is in (``"KiB"``), or ``None`` (bytes, or a count).
        factor: bytes per ``unit`` (1 without one).
        parts: a tuple's readings, one per value, or ``None``.
        problem: why the answer cannot be compared (a form the check does not read, too few digits), else ``None``.
    """

    given: str
    exact: object = None
    number: Decimal | None = None
    unit: str | None = None
    factor: int = 1
    parts: tuple[Reading, ...] | None = None
    problem: Message | None = None

    @property
    def approximate(self) -> bool:
        """Whether this answer (or one of its values) was given at a precision rather than exactly."""
        return self.number is not None or any(p.approximate for p in self.parts or ())

    @property
    def digits(self) -> int | None:
        """Significant digits of an answer given at a precision (``"6.76e5"``: 3); ``None`` for an exact one."""
        return None if self.number is None else len(self.number.as_tuple().digits)

    def agrees(self, value: object, tolerance: float = 0.0) -> bool:
        """Whether ``value`` (the derived answer, or a known wrong one) is what this answer says: exactly, within the
        relative ``tolerance``, or rounded to the answer's digits in its unit."""
        if self.problem is not None:
            return False
        if self.parts is not None:
            return (isinstance(value, (list, tuple)) and len(value) == len(self.parts)
                    and all(p.agrees(v, tolerance) for p, v in zip(self.parts, value)))
        if self.number is not None:
            if not _is_number(value) or not math.isfinite(value):
                return False
            half_unit = Decimal(5).scaleb(self.number.as_tuple().exponent - 1)  # half of the last digit written
            return abs(Decimal(repr(value)) / self.factor - self.number) <= half_unit
        if isinstance(self.exact, str):
            return isinstance(value, str) and _folded(value) == self.exact
        if _is_number(self.exact) and _is_number(value):
            return (math.isclose(self.exact, value, rel_tol=tolerance, abs_tol=0) if tolerance
                    else self.exact == value)
        return self.exact == value

    def shown(self) -> Message | str:
        """The answer as the verdict shows it: as given, with what a unit made of it (``660 KiB``: 675,840 bytes)."""
        if self.number is not None and self.unit is not None:
            scaled = self.number * self.factor
            whole = scaled == scaled.to_integral_value()
            fields = {"answer": self.given, "bytes": f"{int(scaled):,}" if whole else f"{scaled:,f}".rstrip("0"),
                      "unit": self.unit,
                      "size": f"{self.factor:,}"}
            if self.unit in ("KiB", "MiB", "GiB"):
                return Message("{answer} (= {bytes} bytes; binary units: 1 {unit} = {size} bytes)", fields)
            return Message("{answer} (= {bytes} bytes; decimal units: 1 {unit} = {size} bytes)", fields)
        return self.given


def read(answer: object, expected: object, *, byte_count: bool = False) -> Reading:
    """Read ``answer`` as a value of ``expected``'s kind (a number, a name, a tuple).

    Args:
        answer: what the learner gave (``ex.check(answer)``).
        expected: the derived answer: its type says what to read (the value itself is never shown).
        byte_count: the answer counts bytes, so units (KiB, MB, ...) are read; otherwise a unit of bytes is refused.

    Returns:
        A ``Reading``; ``problem`` is set (and nothing compares equal) when the form cannot be read.
    """
    if hasattr(answer, "tolist") and not isinstance(answer, (str, bytes)):  # a numpy value or array, a pandas Series
        answer = answer.tolist()
    if isinstance(expected, (list, tuple)):
        return _read_parts(answer, expected, byte_count)
    if isinstance(answer, (list, tuple)) and len(answer) == 1:
        answer = answer[0]  # the one row a filter left
    if isinstance(expected, str):
        if isinstance(answer, str) and answer.strip():
            return Reading(answer, exact=_folded(answer))
        return _unreadable(answer, wanted_form(expected, byte_count))
    if _is_number(expected):
        return _read_number(answer, expected, byte_count)
    return Reading(repr(answer), exact=answer)  # a kind of answer no exercise has yet: compared as it is


def wanted_form(expected: object, byte_count: bool) -> Message:
    """The form an answer like ``expected`` is wanted in, worded for a verdict (never the value itself)."""
    if isinstance(expected, (list, tuple)):
        example = "(" + ", ".join(str(i + 1) for i in range(len(expected))) + ")"
        return Message("{n} values in parentheses, as {example}", {"n": len(expected), "example": example})
    if isinstance(expected, str):
        return Message("a name in quotes, written as the lesson writes it")
    if byte_count:
        return Message("a number of bytes: 123456, 123,456 or 1.23456e5, or a string with a unit: '123456 bytes', "
                       "'120.6 KiB' (binary, 1 KiB = 1024 bytes) or '123.5 KB' (decimal, 1 KB = 1000 bytes); a number "
                       "given at a precision needs at least {digits} significant digits", {"digits": MIN_DIGITS})
    if isinstance(expected, int):
        return Message("a whole number, as 12 or '12'")
    return Message("a number, as 0.25 or '2.5e-1', with at least {digits} significant digits",
                   {"digits": MIN_DIGITS})


def _read_parts(answer: object, expected: list | tuple, byte_count: bool) -> Reading:
    """A tuple's answer: a list or tuple, or a string of values in brackets (or none), split at commas."""
    given = answer if isinstance(answer, str) else repr(answer)
    if isinstance(answer, str):
        text = unicodedata.normalize("NFKC", answer).strip()
        if text[:1] in _BRACKETS and text.endswith(_BRACKETS[text[0]]):
            text = text[1:-1]
        values = [v.strip() for v in text.split(",")] if "," in text else text.split()
    elif isinstance(answer, (list, tuple)):
        values = list(answer)
    else:
        values = []
    if len(values) != len(expected):
        return _unreadable(answer, wanted_form(expected, byte_count))
    parts = tuple(read(v, e, byte_count=byte_count) for v, e in zip(values, expected))
    problem = next((p.problem for p in parts if p.problem is not None), None)
    if problem is not None:
        return Reading(given, problem=Message("{answer}: {problem}", {"answer": given, "problem": problem}))
    return Reading(given, parts=parts)


def _read_number(answer: object, expected: object, byte_count: bool) -> Reading:
    """A number's answer: a Python number (exact), or a string in one of the forms of the module's docstring."""
    if isinstance(answer, bool) or not isinstance(answer, (str, numbers.Real)):
        return _unreadable(answer, wanted_form(expected, byte_count))
    if not isinstance(answer, str):
        return Reading(repr(answer), exact=answer)
    match = _NUMBER.fullmatch(unicodedata.normalize("NFKC", answer).strip())
    if match is None or not (match["whole"] or match["frac"]):
        return _unreadable(answer, wanted_form(expected, byte_count))
    unit, factor = None, 1
    if match["word"]:
        known = BYTE_UNITS.get(match["word"].lower())
        if byte_count and known is None:
            return Reading(answer, problem=Message(
                "{answer}: '{word}' is not a unit this check reads: bytes, KiB, MiB, GiB (binary: powers of 1024) or "
                "KB, MB, GB (decimal: powers of 1000)", {"answer": answer, "word": match["word"]}))
        if not byte_count and known is not None:
            return Reading(answer, problem=Message(
                "{answer}: this answer is a count, not a number of bytes; give it without '{word}'",
                {"answer": answer, "word": match["word"]}))
        if known is not None and known[1] != 1:
            unit, factor = known
    text = match["sign"] + re.sub(r"[,_ ]", "", match["whole"] or "0") + (match["frac"] or "") + (match["exp"] or "")
    try:
        number = Decimal(text)
    except InvalidOperation:
        return _unreadable(answer, wanted_form(expected, byte_count))
    if not (match["frac"] or match["exp"] or unit):  # a whole number written out: exact
        return Reading(answer, exact=int(number))
    reading = Reading(answer, number=number, unit=unit, factor=factor)
    if reading.digits < MIN_DIGITS:
        singular, plural = Nn_("{answer} has {digits} significant digit: too coarse to tell the answer from a near "
                               "miss; give at least {floor} (as in 1.23e5 or 456 KiB), or the whole number",
                               "{answer} has {digits} significant digits: too coarse to tell the answer from a near "
                               "miss; give at least {floor} (as in 1.23e5 or 456 KiB), or the whole number")
        return Reading(answer, problem=Message(singular, {"answer": answer, "digits": reading.digits,
                                                          "floor": MIN_DIGITS}, plural, reading.digits))
    return reading


def _unreadable(answer: object, wanted: Message) -> Reading:
    given = answer if isinstance(answer, str) else repr(answer)
    return Reading(given, problem=Message("{answer} is not a form this check reads; give {wanted}",
                                          {"answer": repr(answer), "wanted": wanted}))


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _folded(text: str) -> str:
    """A name compared case and spaces aside: ``"FSDP2  bf16 + AC"`` and ``"fsdp2 bf16+ac"`` fold the same."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text)).casefold()
