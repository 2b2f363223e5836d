"""Evaluation: methods (label -> decoder + checkpoint), decoding every prompt of each dataset with
target-only decoding and every method, each method's row (`metrics.py`), and the report
(`report.py`). `python -m xpress_jax.eval` and the reproduction both call `evaluate`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from xpress_jax import atomic
from xpress_jax.checkpoints.hf_drafter import check_drafter_dir
from xpress_jax.data.benchmarks import HARNESS_COMMIT, Question
from xpress_jax.data.chat import prompt_ids
from xpress_jax.data.questions import dataset_label, load_dataset_entry
from xpress_jax.report.published import target_name as published_target_name
from xpress_jax.decoding.profile import component_times
from xpress_jax.decoding.devices import place_on_tensor_mesh, tensor_mesh
from xpress_jax.decoding.padding import PROMPT_BUCKET, round_up, shared_length
from xpress_jax.decoding.speculative import DecodingModels, generate
from xpress_jax.errors import InputError
from xpress_jax.eval.candidates import candidate_mode_agreement
from xpress_jax.eval.metrics import compare_to_reference, summarise
from xpress_jax.eval.report import write_outputs
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.eval.workers import device_groups, replicas, run_on_workers
from xpress_jax.methods import DECODERS, head_of, spec_decoders
from xpress_jax.config import dtype
from xpress_jax.models.build import build_drafter, build_head, build_target, describe_checkpoint, target_config

log = logging.getLogger("xpress_jax.eval")


@dataclasses.dataclass(frozen=True)
class Method:
    """One evaluated row: a label (decoder[.variant]), the decoder it runs, and its checkpoint."""
    label: str
    decoder: str
    checkpoint: str
    branches: int = 1  # D-Loop's branches (dloop decoders)


def with_branches(methods: list[Method], branches) -> list[Method]:
    """Each D-Loop method once per branch count in `branches`; a count k > 1 adds .b<k> to the label."""
    branches = [int(k) for k in branches]
    if not branches or min(branches) < 1:
        raise InputError(f"dloop_branches must be positive integers, got {branches}")
    out = []
    for method in methods:
        if not DECODERS[method.decoder].loop:
            out.append(method)
            continue
        out += [dataclasses.replace(method, label=method.label if k == 1 else f"{method.label}.b{k}", branches=k)
                for k in branches]
    labels = [method.label for method in out]
    if len(set(labels)) != len(labels):
        raise InputError(f"method labels repeat once D-Loop branches are added: {labels}")
    return out


def checkpoint_decoders(checkpoint: str) -> tuple[str, ...]:
    """The one-pass decoders a drafter directory holds: DFlash, and each head found in heads/."""
    from xpress_jax.checkpoints.heads import head_file
    return tuple(d for d in spec_decoders() if not DECODERS[d].loop
                 and (head_of(d) is None or os.path.isfile(head_file(checkpoint, head_of(d)))))


def parse_methods(checkpoints: list[str] | None, decoders, checkpoint: str, branches=(1,)) -> list[Method]:
    """--checkpoints=LABEL=DIR,... or, without it, every --decoders from --checkpoint; D-Loop
    methods once per branch count in `branches`."""
    if not checkpoints:
        bad = [d for d in decoders if d not in spec_decoders()]
        if bad:
            raise InputError(f"unknown decoders {bad}; choose from {', '.join(spec_decoders())}")
        if checkpoint:
            check_drafter_dir(checkpoint, "--checkpoint")
        return with_branches([Method(d, d, checkpoint) for d in decoders], branches)
    methods = []
    for item in checkpoints:
        label, eq, path = item.partition("=")
        decoder = label.split(".", 1)[0]
        if not eq or not path:
            raise InputError(f"--checkpoints item {item!r}: expected LABEL=DIR")
        if decoder not in spec_decoders():
            raise InputError(f"--checkpoints label {label!r}: {decoder!r} is not a decoder; choose from "
                             f"{', '.join(spec_decoders())} (optionally with .variant)")
        check_drafter_dir(path, f"--checkpoints {label}")
        methods.append(Method(label, decoder, path))
    labels = [method.label for method in methods]
    if len(set(labels)) != len(labels):
        raise InputError(f"--checkpoints repeats a label: {labels}")
    return with_branches(methods, branches)


def prompt_tokenizer(config):
    """The target's tokenizer; bytes for a random target (a smoke run, said in the log)."""
    from xpress_jax.data.byte_tokenizer import ByteTokenizer, tokenizer_for
    tok = tokenizer_for(config.data.tokenizer_dir or config.target.hf_dir, target_config(config).vocab_size)
    if isinstance(tok, ByteTokenizer):
        log.warning("no target directory: byte-level prompts (a smoke run with random weights)")
    return tok


def encode_prompts(config, questions: list[str], max_prompt_tokens: int) -> tuple[list[list[int]], int, list[int]]:
    """Chat-formatted one-turn prompt ids; prompts over max_prompt_tokens are skipped (counted),
    never cut: a cut prompt loses the end of the question and the assistant header."""
    tok = prompt_tokenizer(config)
    encoded = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    kept = [p for p in encoded if len(p) <= max_prompt_tokens]
    return kept, len(encoded) - len(kept), stop_ids(tok)


def stop_ids(tok) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]


@dataclasses.dataclass
class Decoded:
    """One decoder's responses, in order: their tokens, per-response statistics, and the seconds of
    the call that decoded each (its batch; one response at batch 1)."""
    tokens: list[list[int]]
    stats: dict[str, np.ndarray]  # DecodeStats fields, [n_responses, ...]
    decode_s: np.ndarray  # [n_responses] the call's seconds less the prefill's (the harness's clock)
    share_s: np.ndarray  # [n_responses] the call's seconds over its rows: summed, each call counted once

    @property
    def seconds(self) -> float:
        """Device seconds of all calls."""
        return float(self.share_s.sum())

    def concat(self, other: "Decoded") -> "Decoded":
        stats = {k: np.concatenate([self.stats[k], other.stats[k]]) for k in self.stats} if self.stats else other.stats
        return Decoded(self.tokens + other.tokens, stats,
                       *(np.concatenate([getattr(self, f), getattr(other, f)]) for f in ("decode_s", "share_s")))

    def take(self, order: list[int]) -> "Decoded":
        """The responses in `order`."""
        return Decoded([self.tokens[i] for i in order], {k: v[order] for k, v in self.stats.items()},
                       self.decode_s[order], self.share_s[order])


EMPTY = Decoded([], {}, np.zeros(0), np.zeros(0))


def run_decoder(models, prompts, decoder: str, settings: EvalSettings, stop_ids, pad: int, desc: str,
                branches: int = 1, reject_drafts: bool = False, prefill_s: float | None = None,
                progress: bool = True) -> Decoded:
    """Decodes every prompt (in batches of settings.batch_size), each call timed (compile excluded). The
    seconds of the same compiled call with a one-token budget (the prefill and its first token, no
    verification step) are taken off each call for the harness's decode time; measured here unless
    given."""
    kw = dict(decoder=decoder, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
              seed=settings.seed, settings=settings.decode(branches).for_decoder(decoder), pad_multiple=pad,
              stop_ids=stop_ids, reject_drafts=reject_drafts, acceptance=settings.acceptance)
    generate(models, prompts[:settings.batch_size], warm_up=True, **kw)  # compile outside the timing
    if prefill_s is None:  # the compiled call once more, timed
        t0 = time.perf_counter()
        generate(models, prompts[:settings.batch_size], warm_up=True, **kw)  # returns host arrays: it has finished
        prefill_s = time.perf_counter() - t0
    tokens, rows, decode_s, share_s = [], [], [], []
    for i in tqdm(range(0, len(prompts), settings.batch_size), desc=desc, leave=False, file=sys.stderr,
                  disable=not progress):
        t0 = time.perf_counter()
        out = generate(models, prompts[i:i + settings.batch_size], **kw)
        seconds = time.perf_counter() - t0
        tokens += out.tokens
        rows.append(out.stats)
        decode_s += [max(seconds - prefill_s, 0.0)] * len(out.tokens)
        share_s += [seconds / len(out.tokens)] * len(out.tokens)
    stats = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}  # [n_prompts, ...]
    return Decoded(tokens, stats, np.asarray(decode_s), np.asarray(share_s))


def build_methods(config, methods: list[Method], drafter_dtype: str, tensor_parallel: int = 1,
                  overridden: frozenset[str] = frozenset(), devices=None):
    """The target once, each distinct drafter checkpoint once, and each method's head, the drafter
    and heads held and computed in `drafter_dtype`. tensor_parallel > 1: the target split over
    that many local devices, the drafters and heads replicated on them (decoding/devices.py).
    `overridden`: the config keys the command line set (a head's recorded sizes win otherwise);
    `devices`: where the target is split (this process's first devices by default)."""
    mesh = tensor_mesh(tensor_parallel, target_config(config), devices)  # a bad count is refused before any weight is read
    target = build_target(config, mesh=mesh)  # shard by shard: the split targets are those no device holds whole
    dtypes = {"dtype": dtype(drafter_dtype), "param_dtype": dtype(drafter_dtype)}
    drafters = {ckpt: build_drafter(config, target, ckpt, dtypes)
                for ckpt in dict.fromkeys(method.checkpoint for method in methods)}
    models = {}
    for method in methods:
        drafter = drafters[method.checkpoint]
        head = build_head(method.decoder, config, drafter.cfg, method.checkpoint, dtypes, overridden)
        models[method.label] = DecodingModels(target, drafter, head)
        if mesh is not None:
            place_on_tensor_mesh(models[method.label], mesh)
    return target, models


@nnx.jit
def _last_position_logits(target, ids, length):  # [1, padded] int32, [] int32 -> [vocab] float32
    return target(ids).logits[0, length - 1].astype(jnp.float32)


def _next_logits(target, sequence: list[int]) -> jax.Array:
    """The target's logits after `sequence` [vocab], from one compiled forward pass per prompt
    bucket length (the pass is causal: padding after the sequence leaves its last position alone)."""
    ids = np.zeros((1, round_up(len(sequence), PROMPT_BUCKET)), np.int32)
    ids[0, :len(sequence)] = sequence
    return _last_position_logits(target, jnp.asarray(ids), jnp.int32(len(sequence)))


def lossless_check(target, prompts, tokens, base_tokens) -> dict:
    """A method's greedy outputs against a target-only reference's: how many prompts differ, their
    share, and for each the first differing position with the target's logit margin there (top-1
    minus top-2, from a plain forward pass over the prompt and the agreed tokens). In float32 no
    prompt differs; in bf16 the verify pass (a block of tokens) and one-token target-only decoding
    round differently, and a small margin says a near-tie flipped, not a bug. Against the
    verify-pass reference (eval.lossless_reference) the arithmetic is the same and any difference is."""
    divergences = []
    for i, (mine, theirs) in enumerate(zip(tokens, base_tokens)):
        if mine == theirs:
            continue
        position = next((j for j, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        top2 = jax.lax.top_k(_next_logits(target, list(prompts[i]) + list(theirs[:position])), 2)[0]
        divergences.append({"prompt": i, "position": position, "target_margin": float(top2[0] - top2[1])})
    return {"mismatches": len(divergences), "mismatch_rate": len(divergences) / max(len(tokens), 1),
            "lossless": not divergences, "first_divergences": divergences}


def lossless_reference(setting: str, target_dtype) -> str:
    """The reference `--check_lossless` compares with. "auto": one-token target-only decoding only
    where it rounds as the verify pass does, float32 on a CPU; on GPUs float32 matmuls run in TF32
    by default and bf16 rounds by shape anywhere, so a one-token pass and a 16-row verification
    can split a near-tie with nothing wrong, and the method's own verify pass (every draft
    refused) is the reference there."""
    if setting != "auto":
        return setting
    exact = jax.default_backend() == "cpu" and jnp.dtype(target_dtype) == jnp.float32
    return "target_only" if exact else "verify_pass"


def tau_of(stats) -> float:
    return float(stats["committed"].sum() / stats["steps"].sum())


def check_lossless_cheaply(method: Method, models: DecodingModels, prompts, mine: Decoded, base: Decoded,
                           settings: EvalSettings, stop_ids, pad: int, ds: str) -> dict:
    """The method's outputs against target-only decoding's (which the eval runs anyway for speedup);
    only the responses that differ are decoded again with the exact reference where that is the
    method's own verify pass (every draft refused): a response is lossless when it equals either."""
    one_token = lossless_check(models.target, prompts, mine.tokens, base.tokens)
    if settings.lossless_reference != "verify_pass":
        return {**one_token, "reference_reruns": 0}
    differ = [d["prompt"] for d in one_token["first_divergences"]]
    reference = list(base.tokens)
    if differ:
        rerun = run_decoder(models, [prompts[i] for i in differ], method.decoder, settings, stop_ids, pad,
                            f"{ds}/{method.label} reference", method.branches, reject_drafts=True, prefill_s=0.0)
        for i, tokens in zip(differ, rerun.tokens):
            reference[i] = tokens
    result = lossless_check(models.target, prompts, mine.tokens, reference)
    return {**result, "reference_reruns": len(differ),
            "against_target_only": {k: one_token[k] for k in ("mismatches", "mismatch_rate", "first_divergences")}}


def measure(method: Method, models: DecodingModels, prompts, mine: Decoded, base: Decoded, settings: EvalSettings,
            stop_ids, pad: int, ds: str, check_lossless: bool) -> tuple[dict, dict | None]:
    """One method's row on one dataset from its decoded responses (with its time split, losslessness
    and candidate mode where asked), and its tau at each count of the iteration sweep (decoders that
    iterate a Jacobi head without D-Loop's branches; None otherwise)."""
    loop = DECODERS[method.decoder].loop
    r = summarise(mine, base, settings.decode().drafted(models.drafter.cfg.block_size), loop=loop)
    r.update(decoder=method.decoder, checkpoint=method.checkpoint or None, lossless=None)
    if loop:
        r["branches"] = method.branches
    if settings.time_split:
        r["time_split"] = component_times(models, prompts[0], decoder=method.decoder,
                                          max_new_tokens=settings.max_new_tokens, pad_multiple=pad,
                                          settings=settings.decode(method.branches).for_decoder(method.decoder))
    if check_lossless and settings.temperature == 0:
        r.update(check_lossless_cheaply(method, models, prompts, mine, base, settings, stop_ids, pad, ds))
    log.info("%s / %s: tau %.3f, %.1f tokens/s, speedup %s", ds, method.label, r["tau"], r["tokens_per_s"],
             r["speedup"])
    if loop or "max_iters" not in DECODERS[method.decoder].knobs:
        return r, None
    if settings.candidate_k > 0 and settings.temperature == 0 and settings.top_k == 0:  # candidate mode vs exact
        r["candidate"] = candidate_mode_agreement(models, list(zip(prompts, base.tokens)), settings.decode(),
                                                  top_k=settings.candidate_k)
        in_candidate_mode = dataclasses.replace(settings, top_k=settings.candidate_k)
        at_k = run_decoder(models, prompts, method.decoder, in_candidate_mode, stop_ids, pad,
                           f"{ds}/{method.label} top-{settings.candidate_k}", prefill_s=0.0)
        r["candidate"].update(tau=tau_of(at_k.stats), tau_exact=r["tau"])
    sweep = {}
    for iterations in settings.iteration_sweep:
        at = dataclasses.replace(settings, max_iters=int(iterations))
        swept = run_decoder(models, prompts, method.decoder, at, stop_ids, pad,
                            f"{ds}/{method.label} {iterations} it.", prefill_s=0.0)
        sweep[str(iterations)] = tau_of(swept.stats)
    return r, sweep or None


def example(tok, question: Question, answer: list[int], rows: dict) -> dict:
    """The first question of a dataset as text: its first turn, the target's answer, and each
    method's target passes over it (what a reader looks at first)."""
    return {"question": question.turns[0], "answer": tok.decode(answer, skip_special_tokens=True),
            "target_passes": {label: int(r["per_prompt"]["steps"][0]) for label, r in rows.items() if "per_prompt" in r}}


def conversation(question: Question, answers: list[str], turn: int) -> list[dict]:
    """The messages before turn `turn`'s answer: each earlier turn with this decoder's own answer to it."""
    messages = []
    for t in range(turn + 1):
        messages.append({"role": "user", "content": question.turns[t]})
        if t < turn:
            messages.append({"role": "assistant", "content": answers[t]})
    return messages


def decode_dataset(ds: str, questions: list[Question], decoders: dict, settings: EvalSettings, tok, stops, pad0: int,
                   progress: bool = True):
    """Every response of one dataset for each decoder (label -> (DecodingModels, Method or None for
    target-only)): turn by turn, a later turn asked after the decoder's own earlier answers (MT-Bench's
    second turn, as the DFlash harness asks it). Returns ({label: (prompts, Decoded)}, responses:
    [{"source", "turn"}]) in question order, each question's turns in order."""
    answers = {label: [[] for _ in questions] for label in decoders}
    prompts = {label: [] for label in decoders}
    decoded = {label: EMPTY for label in decoders}
    where = []  # (question, turn) of each response in decode order
    for turn in range(max((len(q.turns) for q in questions), default=0)):
        asked = [i for i, q in enumerate(questions) if len(q.turns) > turn]
        ids = {label: [prompt_ids(tok, conversation(questions[i], answers[label][i], turn), earlier_think_blocks=False)
                       for i in asked] for label in decoders}
        # a later turn reuses the first turns' programs when its prompts fit them
        pad = max(pad0, shared_length([len(p) for p in sum(ids.values(), [])], settings.prefill_chunk))
        for label, (models, method) in decoders.items():
            desc = f"{ds}/{label}" + (f" turn {turn + 1}" if turn else "")
            out = run_decoder(models, ids[label], method.decoder if method else "target", settings, stops, pad,
                              desc, method.branches if method else 1, progress=progress)
            for i, tokens in zip(asked, out.tokens):
                answers[label][i].append(tok.decode(tokens, skip_special_tokens=True))
            prompts[label] += ids[label]
            decoded[label] = decoded[label].concat(out)
        where += [(i, turn) for i in asked]
    order = sorted(range(len(where)), key=lambda k: where[k])
    responses = [{"question": where[k][0], "source": questions[where[k][0]].source, "turn": where[k][1] + 1}
                 for k in order]
    return {label: ([prompts[label][k] for k in order], decoded[label].take(order)) for label in decoders}, responses


def decode_on_workers(ds: str, questions: list[Question], local: list[dict], settings: EvalSettings, tok, stops,
                      pad0: int):
    """decode_dataset with the questions split over every worker (`eval/workers.py`), merged back
    into question order; each response records the worker that decoded it."""
    def work(decoders, indices, worker):
        decoded, responses = decode_dataset(ds, [questions[i] for i in indices], decoders, settings, tok, stops, pad0,
                                            progress=worker == 0)
        for r in responses:
            r.update(question=indices[r["question"]], device=worker)
        return decoded, responses
    parts = run_on_workers(work, len(questions), local)
    responses = [r for _, part in parts for r in part]
    order = sorted(range(len(responses)), key=lambda k: (responses[k]["question"], responses[k]["turn"]))
    merged = {}
    for label in local[0]:
        prompts = [p for decoded, _ in parts for p in decoded[label][0]]
        runs = EMPTY
        for decoded, _ in parts:
            runs = runs.concat(decoded[label][1])
        merged[label] = ([prompts[k] for k in order], runs.take(order))
    return merged, [{k: responses[i][k] for k in ("source", "turn", "device")} for i in order]


def answer_records(ds: str, decoded: dict, responses: list[dict], tok) -> list[dict]:
    """One record per response and decoder (answers.jsonl): where the question came from, the turn,
    the worker that decoded it, its prompt's length (a later turn's holds this decoder's own earlier
    answers), the answer as text and tokens, its target passes and the tokens each pass committed,
    and whether it equals target-only decoding's answer."""
    _, base = decoded["target"]
    records = []
    for label, (prompts, runs) in decoded.items():
        for i, r in enumerate(responses):
            steps = int(runs.stats["steps"][i])
            records.append({"dataset": ds, "method": label, **r, "prompt_tokens": len(prompts[i]),
                            "text": tok.decode(runs.tokens[i], skip_special_tokens=True), "tokens": runs.tokens[i],
                            "steps": steps, "per_step": runs.stats["per_step"][i][:steps].astype(int).tolist(),
                            "equals_target_only": runs.tokens[i] == base.tokens[i]})
    return records


def protocol(settings: EvalSettings, sets: dict, workers: int) -> dict:
    """Every choice that decides what the figures mean, as results.json records it."""
    return {"harness": f"z-lab/dflash benchmark at {HARNESS_COMMIT} (docs/evaluation.md)",
            "workers": f"{workers} (the questions split over devices and processes, each response decoded alone "
                       f"on one of them; responses.DATASET[i].device)",
            "datasets": sets,
            "chat_template": "Qwen3, thinking off: the assistant header with an empty think block; earlier "
                             "assistant turns as plain text",
            "later_turns": "asked after the decoder's own answers to the earlier turns, each turn one response",
            "batch_size": settings.batch_size, "max_new_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "acceptance": ("greedy" if settings.temperature == 0 else
                           {"rejection": "sampled drafts, rejection sampling (Leviathan et al.)",
                            "match": "argmax drafts accepted while they equal the target's sampled tokens "
                                     "(the DFlash harness)"}[settings.acceptance]),
            "tau": "tau_per_prompt_mean: mean over responses of each one's tokens per target pass (bonus "
                   "included; the harness's); tau: pooled over all steps",
            "speedup": "speedup_harness: target-only's mean decode seconds per output token over the method's, "
                       "prefill excluded (the harness's); speedup: pooled tokens/s with prefill"}


def evaluate(config, methods: list[Method], settings: EvalSettings, *, check_lossless: bool = False,
             overridden: frozenset[str] = frozenset()) -> tuple[dict, int]:
    """Runs target-only decoding once per dataset and every method against it; writes results.json,
    results.md and the plots to settings.out_dir. Returns (report, number of outputs that differ from
    target-only decoding at temperature 0 when check_lossless). `overridden`: the config keys the
    command line set (`build_methods`). In a multi-process run every process returns the whole report
    (the measurements after decoding, such as the iteration sweep, run on each) and process 0 writes it."""
    # the questions and the tokenizer first: bad data is refused before any weight is read
    labels = [dataset_label(entry) for entry in settings.datasets]  # NAME=PATH is reported as NAME
    if len(set(labels)) != len(labels):
        raise InputError(f"eval.datasets {list(settings.datasets)}: two entries are both called "
                         f"{next(x for x in labels if labels.count(x) > 1)!r}")
    sets = {ds: load_dataset_entry(entry, settings.num_prompts) for ds, entry in zip(labels, settings.datasets)}
    tok = prompt_tokenizer(config)
    stops = stop_ids(tok)
    questions, skipped_long, first_lengths = {}, {}, []
    for ds, qs in sets.items():
        lengths = [len(prompt_ids(tok, conversation(q, [], 0), earlier_think_blocks=False)) for q in qs.questions]
        questions[ds] = [q for q, n in zip(qs.questions, lengths) if n <= settings.max_prompt_tokens]
        skipped_long[ds] = len(lengths) - len(questions[ds])
        if not questions[ds]:
            raise InputError(f"{ds}: every prompt is longer than eval.max_prompt_tokens={settings.max_prompt_tokens}")
        first_lengths += [n for n in lengths if n <= settings.max_prompt_tokens]
    groups = device_groups(settings.devices, settings.tensor_parallel)  # a bad count is refused before any weight is read
    target, models = build_methods(config, methods, settings.drafter_dtype, settings.tensor_parallel, overridden,
                                   groups[0])
    reference = lossless_reference(settings.lossless_reference, target.dtype)
    settings = dataclasses.replace(settings, lossless_reference=reference)
    os.makedirs(settings.out_dir, exist_ok=True)
    # one padded length for every dataset's first turns, the longest one's bucket: one program per decoder setting
    pad = shared_length(first_lengths, settings.prefill_chunk)
    results, sweep, examples, responses = {}, {}, {}, {}
    decoders = {"target": (DecodingModels(target), None),
                **{method.label: (models[method.label], method) for method in methods}}
    local = replicas(decoders, groups, target.cfg)  # the first group holds `decoders` themselves
    answers = []
    for ds in labels:
        decoded, responses[ds] = decode_on_workers(ds, questions[ds], local, settings, tok, stops, pad)
        answers += answer_records(ds, decoded, responses[ds], tok)
        _, base = decoded["target"]
        results[ds] = {"target": {**summarise(base, base, None), "accept_per_position": []}}
        for method in methods:
            prompts, mine = decoded[method.label]
            # the first turns' programs serve every later call; a longer later turn takes its own bucket
            method_pad = max(pad, shared_length([len(p) for p in prompts], settings.prefill_chunk))
            results[ds][method.label], by_iterations = measure(method, models[method.label], prompts, mine, base,
                                                               settings, stops, method_pad, ds, check_lossless)
            if by_iterations:
                sweep.setdefault(ds, {})[method.label] = by_iterations
        compare_to_reference(results[ds])
        examples[ds] = example(tok, questions[ds][0], base.tokens[0], results[ds])
    one_checkpoint = len({method.checkpoint for method in methods}) == 1
    report = {"date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind, "settings": settings.as_dict(),
              "protocol": protocol(settings, {ds: {**sets[ds].protocol, "skipped_long_prompts": skipped_long[ds],
                                            "responses": len(responses[ds])} for ds in labels},
                                   workers=len(groups) * jax.process_count()),
              # the published model this target's shape is, whose papers' figures results.md sets beside
              "published_target": published_target_name(target.cfg),
              # what the speedups were measured with
              "dtypes": {"target": config.target_param_dtype, "target_compute": config.dtype,
                         "drafter_and_heads": settings.drafter_dtype},
              "methods": {method.label: {"decoder": method.decoder, "checkpoint": method.checkpoint or None,
                                    **({"branches": method.branches} if DECODERS[method.decoder].loop else {})}
                          for method in methods},
              **describe_checkpoint(methods[0].checkpoint if one_checkpoint else ""),
              "skipped_long_prompts": skipped_long, "padded_prompt_length": pad, "results": results,
              "responses": responses, "iteration_sweep": sweep, "examples": examples}
    if jax.process_index() == 0:  # every process holds the same report; one writes it
        write_outputs(report, settings.out_dir)
        atomic.write_text(os.path.join(settings.out_dir, "answers.jsonl"), "".join(json.dumps(a) + "\n" for a in answers))
    failures = sum(r.get("mismatches", 0) for rows in results.values() for r in rows.values())
    return report, failures
