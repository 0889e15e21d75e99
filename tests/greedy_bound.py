"""Where a rounded runner's greedy picks leave float32's on SmolLM2: teacher-forced on
float32's own picks over a few chat prompts, the steps taken and, for each step whose pick
differs, how far below float32's best the rounded runner's pick was in float32's logits."""

from __future__ import annotations

from typing import Any

BOUND_PROMPTS = ["Name three colours.", "Explain what a CPU cache is.", "What is 17 times 23?",
                 "How do I reverse a list in Python?", "Tell me a fun fact about owls.",
                 "Give me a JSON object with a name and an age."]


def greedy_gaps(backend: Any, rounded: Any, steps_per_prompt: int = 24,
                ) -> tuple[int, list[float]]:
    """(steps, gaps) of `rounded` (a runner of `backend`) against a float32 runner."""
    exact = backend.runner(weights="float32")
    steps, gaps = 0, []
    for text in BOUND_PROMPTS:
        prompt = backend.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        seq, ref = rounded.add(), exact.add()
        ours, theirs = rounded.forward([(seq, prompt)]), exact.forward([(ref, prompt)])
        for _ in range(steps_per_prompt):
            token, pick = int(theirs[-1].argmax()), int(ours[-1].argmax())
            steps += 1
            if pick != token:
                gaps.append(float(theirs[-1, token] - theirs[-1, pick]))
            ours, theirs = rounded.forward([(seq, [token])]), exact.forward([(ref, [token])])
        rounded.remove(seq)
        exact.remove(ref)
    return steps, gaps
