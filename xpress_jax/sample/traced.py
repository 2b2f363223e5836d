"""Answers to a few prompts from one decoder, each with its trace: the tokens every target pass
committed, so a reader sees where the drafter's guesses held and where they broke."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from xpress_jax.data.chat import prompt_ids
from xpress_jax.decoding.padding import shared_length
from xpress_jax.decoding.speculative import DecodingModels
from xpress_jax.eval.evaluate import build_methods, parse_methods, prompt_tokenizer, run_decoder, stop_ids
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.models.build import build_target

TARGET_ONLY = "target"


@dataclasses.dataclass
class TracedAnswer:
    prompt: str
    decoder: str
    prompt_tokens: int
    text: str
    tokens: list[int]
    per_step: list[int]  # tokens each verification pass committed (after the prefill's first token)
    pieces: list[str]  # the prefill's token(s), then the text each verification pass committed
    tokens_per_s: float

    @property
    def tau(self) -> float:
        """Tokens per verification pass (bonus token included), as eval's per-prompt tau."""
        return sum(self.per_step) / max(len(self.per_step), 1)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "steps": len(self.per_step), "tau": round(self.tau, 3)}


def answer_prompts(config, texts: list[str], *, checkpoint: str, decoder: str, temperature: float,
                   max_new_tokens: int) -> list[TracedAnswer]:
    """Each prompt (a user turn, through the chat template) answered by `decoder` at batch 1, with
    the eval's settings (config.eval) for everything else."""
    s = dataclasses.replace(EvalSettings.from_config(config.eval), temperature=temperature,
                            max_new_tokens=max_new_tokens, batch_size=1)
    tok = prompt_tokenizer(config)
    prompts = [prompt_ids(tok, [{"role": "user", "content": t}], earlier_think_blocks=False) for t in texts]
    branches = 1
    if decoder == TARGET_ONLY:
        models = DecodingModels(build_target(config))
    else:
        method = parse_methods(None, [decoder], checkpoint, s.dloop_branches[:1])[0]
        _, built = build_methods(config, [method], s.drafter_dtype)
        models, branches = built[method.label], method.branches
    pad = shared_length([len(p) for p in prompts], s.prefill_chunk)
    out = run_decoder(models, prompts, decoder, s, stop_ids(tok), pad, f"sample/{decoder}", branches,
                      progress=len(prompts) > 1)
    answers = []
    for i, text in enumerate(texts):
        tokens = out.tokens[i]
        per_step = out.stats["per_step"][i][:int(out.stats["steps"][i])].astype(int).tolist()
        ends = np.cumsum([len(tokens) - sum(per_step)] + per_step).tolist()  # the prefill's token(s), then each pass
        pieces = [tok.decode(tokens[a:b]) for a, b in zip([0] + ends[:-1], ends)]
        answers.append(TracedAnswer(text, decoder, len(prompts[i]), tok.decode(tokens, skip_special_tokens=True),
                                    tokens, per_step, pieces, len(tokens) / max(float(out.share_s[i]), 1e-9)))
    return answers


def render(answer: TracedAnswer) -> str:
    """The answer as a reader wants it: the prompt, a summary line, the text, and the trace (the
    prefill's token, then each verification pass's tokens in brackets, newlines shown as \\n)."""
    shown = ["[" + piece.replace("\n", "\\n") + "]" for piece in answer.pieces]
    return (f"> {answer.prompt}\n"
            f"{answer.decoder}: {len(answer.tokens)} tokens, the first from the prefill, then "
            f"{len(answer.per_step)} verification passes (tau {answer.tau:.2f}); {answer.tokens_per_s:.1f} "
            f"tokens/s on {jax.devices()[0].device_kind}\n"
            f"{answer.text}\n"
            f"trace (prefill {shown[0]}, then tokens per pass: {' '.join(map(str, answer.per_step))}):\n"
            f"{' '.join(shown[1:])}\n")
