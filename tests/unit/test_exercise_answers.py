"""Value answers in the forms people write them (issue 44): grouped digits, exponents, units of bytes (binary and
decimal, said which), a precision with a floor of significant digits, tuples in any spacing, names case and spaces
aside; a form the check cannot read says which form is wanted and is not counted; known wrong answers keep their
notes. Each form is tested both ways: the right number passes, a wrong one in the same form fails."""

from __future__ import annotations

import pytest

import tutorial_lib as tl
from tutorial_lib.exercises.answers import read

ADAMW_01_2 = 675_928  # 01.2's answer: 2 x 4 x 84,488 parameters + 4 x 6 step counters
STEP_COUNTERS_MISSED = 675_904  # 01.2's known near miss
FP16_HOOK_10_2 = 921_602  # 10.2's answer: 460,801 gradient elements x 2 bytes


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def checks(runs, exercise_id: str) -> int:
    return int(tl.progress(runs).loc[exercise_id, "checks"])


def test_the_exact_answer_is_derived_as_this_file_says():
    assert tl.exercise("01.2").spec.expected(None) == ADAMW_01_2
    assert tl.exercise("10.2").spec.expected(None) == FP16_HOOK_10_2
    assert STEP_COUNTERS_MISSED in tl.exercise("01.2").spec.wrong


@pytest.mark.parametrize("right, wrong", [
    ("675,928", "675,929"), ("675 928", "675 929"), ("675_928", "675_929"), ("675928 bytes", "675929 bytes"),
    ("675928 B", "675929 B"), ("  675928  ", "675929"), ("６７５９２８", "６７５９２９"), ("675928.0", "675929.0"),
    ("6.759280e+05", "6.759290e+05"), ("6.75928e5", "6.75929e5"), (675_928, 675_929), (675_928.0, 675_929.0),
])
def test_the_exact_number_written_as_people_write_it_passes_and_a_wrong_one_in_the_same_form_fails(tmp_path, right,
                                                                                                   wrong):
    ex = tl.exercise("01.2", tmp_path)
    assert ex.check(right).solved, str(ex.check(right))
    verdict = ex.check(wrong)
    assert not verdict.solved and verdict.attempted and verdict.differences, str(verdict)
    assert str(ADAMW_01_2) not in str(verdict) and f"{ADAMW_01_2:,}" not in str(verdict)


@pytest.mark.parametrize("right, wrong, said", [
    ("900 KiB", "910 KiB", "binary units: 1 KiB = 1,024 bytes"),
    ("0.879 MiB", "0.869 MiB", "binary units: 1 MiB = 1,048,576 bytes"),
    ("921.6 KB", "925.6 KB", "decimal units: 1 KB = 1,000 bytes"),
    ("0.922 MB", "0.932 MB", "decimal units: 1 MB = 1,000,000 bytes"),
    ("0.000858 GiB", "0.000868 GiB", "binary units: 1 GiB = 1,073,741,824 bytes"),
    ("9.22e5", "9.32e5", None), ("9.216e5", "9.226e5", None), ("900.0 kib", "909.0 kib", "1 KiB = 1,024 bytes"),
])
def test_a_number_given_at_a_precision_or_in_a_unit_agrees_when_the_answer_rounds_to_it(tmp_path, right, wrong, said):
    ex = tl.exercise("10.2", tmp_path)
    solved = ex.check(right)
    assert solved.solved, str(solved)
    assert "significant digits" in str(solved) and (said is None or said in str(solved)), str(solved)
    verdict = ex.check(wrong)
    assert not verdict.solved and verdict.attempted and (said is None or said in str(verdict)), str(verdict)
    assert str(FP16_HOOK_10_2) not in str(verdict) and f"{FP16_HOOK_10_2:,}" not in str(verdict)


def test_binary_and_decimal_units_are_told_apart():
    kib, kb = read("900 KiB", 1, byte_count=True), read("900 KB", 1, byte_count=True)
    assert kib.agrees(921_602) and not kb.agrees(921_602)
    assert kb.agrees(900_100) and not kib.agrees(900_100)


def test_an_answer_too_coarse_to_tell_from_a_near_miss_asks_for_digits_and_is_not_counted(tmp_path):
    ex = tl.exercise("10.2", tmp_path)
    for coarse in ("7e5", "9e5", "9.2e5", "1 MiB", "0.88 MiB"):
        verdict = ex.check(coarse)
        assert not verdict.solved and not verdict.attempted and "at least 3" in str(verdict), str(verdict)
        assert "not counted" in str(verdict)
    assert checks(tmp_path, "10.2") == 0


def test_a_precise_answer_that_a_known_mistake_also_rounds_to_asks_for_more_digits_and_is_not_counted(tmp_path):
    """01.2's near miss (the step counters forgotten, 24 bytes less) agrees with the answer to 3 and 4 digits: "6.76e5"
    and "660 KiB" cannot tell them apart, so the check asks for more digits instead of passing a possible mistake."""
    ex = tl.exercise("01.2", tmp_path)
    for ambiguous in ("6.76e5", "660 KiB", "0.645 MiB", "675.9 KB"):
        verdict = ex.check(ambiguous)
        assert not verdict.solved and not verdict.attempted, str(verdict)
        assert "known mistake" in str(verdict) and "more significant digits" in str(verdict)
    assert "1 KiB = 1,024 bytes" in str(ex.check("660 KiB")), "says how it read the unit"
    assert ex.check("6.75928e5").solved and ex.check("660.086 KiB").solved
    near = ex.check("6.75904e5")
    assert not near.solved and "step counter" in str(near.differences[0].note)
    assert checks(tmp_path, "01.2") == 3


@pytest.mark.parametrize("answer, wanted", [
    ("about six hundred thousand", "a number of bytes"), ("675928 apples", "not a unit this check reads"),
    ("1,12", "a number of bytes"), (True, "a number of bytes"), ({"bytes": 1}, "a number of bytes"),
    ("", "a number of bytes"), ([1, 2], "a number of bytes"),
])
def test_a_form_the_check_cannot_read_says_which_form_is_wanted_and_is_not_counted(tmp_path, answer, wanted):
    ex = tl.exercise("01.2", tmp_path)
    verdict = ex.check(answer)
    assert not verdict.solved and not verdict.attempted and wanted in str(verdict.problem), str(verdict)
    assert verdict.differences == [] and "not counted" in str(verdict)
    assert checks(tmp_path, "01.2") == 0


def test_a_count_takes_a_word_but_not_a_unit_of_bytes(tmp_path):
    ex = tl.exercise("08.2", tmp_path)
    right = ex.spec.expected(None)
    assert ex.check(f"{right} buckets").solved and ex.check(str(right)).solved
    assert not ex.check(f"{right + 1} buckets").solved
    verdict = ex.check(f"{right} KiB")
    assert not verdict.solved and not verdict.attempted and "a count, not a number of bytes" in str(verdict)


@pytest.mark.parametrize("right, wrong", [
    ((1, 12), (1, 13)), ([1, 12], [1, 13]), ("(1, 12)", "(1, 13)"), ("(1,12)", "(1,13)"), ("[1, 12]", "[0, 12]"),
    ("1, 12", "1, 13"), ("1 12", "1 13"), ("( 1 ,12 )", "( 1 ,13 )"), ("（1，12）", "（1，13）"),
])
def test_a_tuple_in_any_spacing_and_brackets_is_read_value_by_value(right, wrong):
    expected = (1, 12)
    assert read(right, expected).agrees(expected), right
    assert not read(wrong, expected).agrees(expected) and read(wrong, expected).problem is None, wrong


def test_a_tuple_of_the_wrong_length_says_which_form_is_wanted():
    for answer in ("(1)", "(1, 12, 3)", "x", 12, "(1, x)"):
        reading = read(answer, (1, 12))
        assert reading.problem is not None and not reading.agrees((1, 12)), answer
    assert "2 values in parentheses" in str(read("(1, 12, 3)", (1, 12)).problem)


def test_a_name_is_compared_case_and_spaces_aside_and_a_number_for_a_name_is_a_form_problem(tmp_path):
    ex = tl.exercise("11.1", tmp_path)
    right = ex.spec.expected(None)
    for variant in (right, right.upper(), right.lower(), right.replace(" ", ""), f"  {right}  ".replace(" ", "  ")):
        assert ex.check(variant).solved, variant
    wrong = next(iter(ex.spec.wrong))
    verdict = ex.check(wrong.upper())
    assert not verdict.solved and verdict.differences[0].note is not None, "a known wrong name keeps its note"
    verdict = ex.check(4)
    assert not verdict.solved and not verdict.attempted and "a name in quotes" in str(verdict.problem)


def test_known_wrong_answers_keep_their_notes_in_every_form(tmp_path):
    ex = tl.exercise("01.2", tmp_path)
    for form in (STEP_COUNTERS_MISSED, "675,904", "675904 bytes", "6.75904e5"):
        verdict = ex.check(form)
        assert not verdict.solved and "step counter" in str(verdict.differences[0].note), form
    verdict = tl.exercise("10.2", tmp_path).check("1.76 MiB")  # 1,843,204 (fp32) to the digits given
    assert not verdict.solved and "fp32" in str(verdict.differences[0].note)
