"""Answer types on real-looking answers: case, whitespace, punctuation, units, choice letters in prose."""

import pytest

from grpo_kit.data.answer_format import answer_matches, infer_answer_type, normalize_text, parse_choice


@pytest.mark.parametrize(("truth", "kind"), [
    ("42", "number"), ("1,350", "number"), ("$27.50", "number"), ("-7", "number"), ("12 kg", "number"),
    ("3.5%", "number"), ("C", "choice"), ("(b)", "choice"), ("e", "choice"), ("Paris", "string"),
    ("3 or 4", "string"), ("2/3", "string"), ("The Eiffel Tower", "string"), ("F", "string"), ("AB", "string"),
])
def test_the_type_is_inferred_from_the_right_answer(truth, kind):
    assert infer_answer_type(truth) == kind


@pytest.mark.parametrize(("predicted", "truth"), [
    ("1350", "1,350"), ("$1,350.00", "1350"), ("18 dollars.", "18"), (" 42 ", "42"), ("0.5 kg", "0.5"),
    ("B", "B"), ("(b)", "B"), ("b)", "B"), ("The answer is B.", "B"), ("I pick (c) because it fits", "C"),
    ("Option D", "D"), ("answer: e", "E"),
    ("paris", "Paris"), ("  The Eiffel Tower. ", "Eiffel Tower"), ('"blue whale"', "Blue   Whale"), ("an "
                                                                                                     "apple!", "apple"),
])
def test_right_answers_match_whatever_their_surface(predicted, truth):
    assert answer_matches(predicted, truth)


@pytest.mark.parametrize(("predicted", "truth"), [
    ("1351", "1,350"), ("13.5", "1350"), ("3 or 4", "3"), (None, "3"), ("", "3"),
    ("A or B", "B"), ("C", "B"), ("The answer is (a)", "B"), ("", "B"),
    ("London", "Paris"), ("Eiffel", "Eiffel Tower"), ("paris france", "Paris"),
])
def test_wrong_or_ambiguous_answers_do_not_match(predicted, truth):
    assert not answer_matches(predicted, truth)


def test_the_explicit_types_and_tolerance():
    assert answer_matches("3.14", "3.14159", "number", abs_tol=0.01) and not answer_matches("3.14", "3.14159", "number")
    assert answer_matches("3.2", "3.0", "number", rel_tol=0.1) and not answer_matches(
        "3.4", "3.0", "number", rel_tol=0.1
    )
    assert answer_matches("colour", r"colou?r", "regex") and answer_matches(" COLOR ", r"colou?r", "regex")
    assert not answer_matches("colours", r"colou?r", "regex")
    assert answer_matches("42", "42.0", "string") is False  # a string compares text, not value
    assert answer_matches("x=4", "4", "function", function=lambda p, t: p.split("=")[-1] == t)
    with pytest.raises(ValueError, match="needs a function"):
        answer_matches("4", "4", "function")
    with pytest.raises(ValueError,
                       match="answer_type 'fuzzy': one of auto, number, choice, string, regex, math, function"):
        answer_matches("4", "4", "fuzzy")


def test_normalising_and_choice_parsing():
    assert normalize_text("  The   Eiffel\nTower. ") == "eiffel tower"
    assert parse_choice("A or B") is None and parse_choice("no letter here") is None and parse_choice("(d)") == "D"
