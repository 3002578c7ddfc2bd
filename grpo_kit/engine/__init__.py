"""Models and the forward passes that run them: where the weights come from (`hub`), loading and LoRA (`models`,
`model_config`), the one place that knows cpu / cuda / xla (`device`), the lean Gemma forward (`decoder`), the
sampler seam every caller samples through (`sampler`: `Sampler.generate`, `Sampler.logprobs`), the sampling
machinery behind it (`sampling`, with `sample_hf` its plain reference through HF's forward), the token-choice math
(`choice`), the CPU's fast paths kept apart from that reference (`cpu/`: bf16 and prepacked weight products, the LM
head streamed through the draw) and every path to log-probs (`logprobs`).

Import rule: the foundations and `data` (the chat template, the answer tags) only; the engine never imports
training, evaluation or the course, so it can be used, tested and replaced on its own.
"""
