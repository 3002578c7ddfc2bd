"""The arc's stages: the models it evaluates, in order, and what each is called on a page.

`base` is the model before training; `sft` after the warm-up; `grpo` after GRPO; `control` after as much more SFT
as GRPO's time; `rft` after rejection-sampling fine-tuning for GRPO's time. The names are the arc's phase names,
its subdirectories and the command line's `--stage` choices.
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    BASE = "base"
    SFT = "sft"
    GRPO = "grpo"
    CONTROL = "control"
    RFT = "rft"

    @property
    def label(self) -> str:
        """What a table or a plot calls it."""
        return _LABELS[self]

    @classmethod
    def trained(cls) -> tuple[Stage, ...]:
        """The stages the arc trains (each has a subdirectory and a `final` checkpoint): all but base."""
        return tuple(s for s in cls if s is not cls.BASE)

    @classmethod
    def controls(cls) -> tuple[Stage, ...]:
        """The stages that start from the SFT model and train for as long as GRPO did."""
        return (cls.CONTROL, cls.RFT)

    @classmethod
    def named(cls, name: str) -> Stage:
        """The stage called `name`; a ValueError naming it and the stages there are otherwise."""
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unknown stage {name!r}: one of {', '.join(cls)}") from None


_LABELS = {Stage.BASE: "base", Stage.SFT: "SFT", Stage.GRPO: "GRPO", Stage.CONTROL: "more SFT", Stage.RFT: "RFT"}
