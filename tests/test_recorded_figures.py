"""Every recorded question's figure.py draws its figure from the files committed beside it (a figure module that no
longer imports, or reads a file that is gone, fails here rather than in a notebook or a README's instructions)."""

from __future__ import annotations

import pytest

from kvlab.lab import recorded

QUESTIONS = sorted(p.parent.name for p in recorded.data_dir().glob("*/figure.py"))


def test_every_question_folder_with_a_figure_is_found():
    assert len(QUESTIONS) >= 20


@pytest.mark.parametrize("question", QUESTIONS)
def test_the_figure_draws_from_its_recording(question):
    fig = recorded.load(question).figure()
    assert fig.data, f"{question}'s figure has no traces"
