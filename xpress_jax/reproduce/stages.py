"""The tiny reproduction's stages (the library behind `python -m xpress_jax.reproduce`): what
each stage trains, its config, running it with caching and resumption, and gathering the results.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import sys
import time
import uuid

from xpress_jax import assets, atomic, cli
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.reproduce.results import same_budget_ratios, table

# stage -> how it trains: budget (a `reproduce` field), what trains, which heads, the stage it
# starts from (its export) and loss overrides
TRAIN_STAGES = {
    "dflash": dict(steps="drafter_steps", trainable="drafter", heads=(), init=None, loss={}),
    # the same-budget reference: the DFlash drafter trained head_steps more with its own objective,
    # as many steps on the same data as every stage below spends after dflash/
    "dflash.more": dict(steps="head_steps", trainable="drafter", heads=(), init="dflash", loss={}),
    "xpress": dict(steps="head_steps", trainable="all", heads=("xpress",), init="dflash", loss={}),
    "xpress.frozen": dict(steps="head_steps", trainable="heads", heads=("xpress",), init="dflash", loss={}),
    "markov": dict(steps="head_steps", trainable="heads", heads=("markov",), init="dflash", loss={}),
    "gru": dict(steps="head_steps", trainable="heads", heads=("gru",), init="dflash", loss={}),
    # D-Loop: the same drafter, fine-tuned with the complementary prefix-suffix objective
    "dloop": dict(steps="head_steps", trainable="drafter", heads=(), init="dflash", loss={"dloop": 1.0}),
    # the composition neither paper has: an XPress refiner on the frozen D-Loop drafter
    "dloop+xpress": dict(steps="head_steps", trainable="heads", heads=("xpress",), init="dloop", loss={}),
}
STAGES = ("target", "regen") + tuple(TRAIN_STAGES) + ("eval",)
NEEDS = {"target": (), "regen": ("target",), "eval": STAGES[:-1],  # done before a stage
         **{s: ("target", "regen") + ((t["init"],) if t["init"] else ()) for s, t in TRAIN_STAGES.items()}}
# stages a config may take as given instead of producing them: stage -> its `reproduce` field
SHIPPABLE = {"target": "target_from", "dflash": "dflash_from"}


def shipped(config) -> dict[str, str]:
    """{stage: directory} of the stages the config takes as given (an HF target, a drafter export)."""
    return {stage: config.reproduce[field] for stage, field in SHIPPABLE.items() if config.reproduce[field]}


def pipeline(config) -> tuple[str, ...]:
    """The stages the config runs, in order: every stage but the shipped ones and the training
    stages outside reproduce.train_stages."""
    given, trained = shipped(config), set(config.reproduce.train_stages)
    return tuple(s for s in STAGES if s not in given and (s not in TRAIN_STAGES or s in trained))


def needs(config, stage: str) -> tuple[str, ...]:
    """The stages `stage` is built on, within what this config runs or ships (eval: every method)."""
    present = set(pipeline(config)) | set(shipped(config))
    if stage == "eval":
        return tuple(s for s in NEEDS[stage] if s in present)
    return NEEDS[stage]


def method_stages(config) -> tuple[str, ...]:
    """The training stages whose exports the eval measures: trained here or shipped."""
    present = set(pipeline(config)) | set(shipped(config))
    return tuple(s for s in TRAIN_STAGES if s in present)


def stage_dir(config, run: str, stage: str) -> str:
    return shipped(config).get(stage) or os.path.join(run, stage)


def export_dir(config, run: str, stage: str) -> str:
    """A training stage's drafter export (a shipped drafter is an export itself)."""
    return shipped(config).get(stage) or os.path.join(run, stage, "export")


def available(config, run: str, stage: str) -> bool:
    return stage in shipped(config) or is_done(run, stage)


# The config fields that decide what a stage produces. A finished stage records them (and the
# DONE.json of each stage it was built on); a later run reuses it only while they still match.
_NOT_RESULTS = {"out_dir", "save_every", "log_every", "keep", "async_checkpointing", "max_bad_steps",
                "allow_config_change", "report_prompts", "report_max_new_tokens", "init_from", "train_files",
                "tokenizer_dir", "distributed", "time_split"}
_STAGE_FIELDS = {"target": ("seed", "target.arch", "pretrain", "drafter.mask_token_id"),
                 "regen": ("reproduce.regen_records", "reproduce.regen_max_new_tokens", "data.max_len"),
                 "eval": ("eval", "reproduce.temperatures", "reproduce.speed_verify_tokens")}


def stage_settings(config, stage: str) -> dict:
    """{dotted field: value} of what `stage` produces from, JSON-normalised."""
    if stage in TRAIN_STAGES:
        fields = ("seed", "dtype", "drafter", "heads", "train", "data", f"reproduce.{TRAIN_STAGES[stage]['steps']}")
    else:
        fields = _STAGE_FIELDS[stage]
    out = {}

    def add(name, value):
        if hasattr(value, "items"):
            for k, v in value.items():
                if k not in _NOT_RESULTS:
                    add(f"{name}.{k}", v)
        else:
            out[name] = json.loads(json.dumps(value, default=list))

    for name in fields:
        value = config
        for part in name.split("."):
            value = value[part]
        add(name, value)
    return out


def _stage_digest(config, run: str, stage: str) -> str:
    """What identifies a stage's output to the stages built on it: its DONE.json, or the shipped weights."""
    given = shipped(config).get(stage)
    path = os.path.join(given, "model.safetensors") if given else _done_path(run, stage)
    return assets.sha256(path)[:16]


def stale_reason(config, run: str, stage: str) -> str | None:
    """Why the finished `stage` does not match the config or the stages it was built on (None: it does)."""
    with open(_done_path(run, stage)) as f:
        done = json.load(f)
    now = stage_settings(config, stage)
    changed = sorted(k for k in set(now) | set(done["settings"]) if now.get(k) != done["settings"].get(k))
    if changed:
        shown = ", ".join(f"{k}={done['settings'].get(k)!r} (now {now.get(k)!r})" for k in changed[:4])
        return f"it was made with {shown}"
    inputs = done.get("inputs", {})
    for need, digest in inputs.items():
        if not available(config, run, need) or _stage_digest(config, run, need) != digest:
            return f"it was built on an earlier {need}/"
    new = [need for need in needs(config, stage) if need not in inputs]  # a stage added since (eval: a method)
    if new:
        return f"it was made without {', '.join(n + '/' for n in new)}"
    return None


def _done_path(run: str, stage: str) -> str:
    return os.path.join(run, stage, "DONE.json")


def is_done(run: str, stage: str) -> bool:
    return os.path.isfile(_done_path(run, stage))


def _add_elapsed(run: str, stage: str, seconds: float) -> float:
    """Adds this run's seconds to the stage's total over all its runs (STAGE/elapsed.json) and returns it."""
    path = os.path.join(run, stage, "elapsed.json")
    total = seconds
    if os.path.isfile(path):
        with open(path) as f:
            total += json.load(f)["seconds"]
    atomic.write_json(path, {"seconds": round(total, 1)})
    return total


def _mark_done(config, run: str, stage: str, seconds: float, summary: dict) -> None:
    path = _done_path(run, stage)
    # finish_id: a redone stage never has the DONE.json it had, so the stages built on it see the change
    record = {"stage": stage, "seconds": round(seconds, 1), **summary, "finish_id": uuid.uuid4().hex,
              "settings": stage_settings(config, stage),
              "inputs": {need: _stage_digest(config, run, need) for need in needs(config, stage)}}
    atomic.write_json(path, record)


def stage_config(config, run: str, stage: str):
    """The base config with the stage's target, data, budget and output directory set."""
    c = copy.deepcopy(config)
    c.unlock()
    r = c.reproduce
    if stage != "target":
        c.target.hf_dir = stage_dir(config, run, "target")
        c.data.tokenizer_dir = stage_dir(config, run, "target")
    c.data.train_files = (os.path.join(run, "regen", "data.jsonl"),)
    c.train.out_dir = os.path.join(run, stage)
    if stage in TRAIN_STAGES:
        t = TRAIN_STAGES[stage]
        c.train.update(steps=r[t["steps"]], trainable=t["trainable"], heads=t["heads"],
                       init_from=export_dir(config, run, t["init"]) if t["init"] else "")
        c.train.loss.update(t["loss"])
    c.lock()
    return c


def run_stage(config, run: str, stage: str) -> dict:
    c = stage_config(config, run, stage)
    if stage == "target":
        from xpress_jax.pretrain.target import pretrain
        summary = pretrain(c, out_dir=os.path.join(run, "target"))
        greedy = summary.pop("greedy", {})
        return {**summary, **{k: v for k, v in greedy.items() if k != "examples"}}
    if stage == "regen":
        return regenerate_sample(c, run)
    if stage == "eval":
        return evaluate_all(c, run)
    from xpress_jax.train.run import train
    result = train(c)
    return {"step": result["step"], "steps": result["steps"], "final_metrics": result["metrics"]}


def regenerate_sample(config, run: str) -> dict:
    """The target answers a seeded sample of its training questions (GSM8K and code mixed): the
    corpus its pretraining wrote, or for a shipped target the same corpus rebuilt."""
    import numpy as np
    from xpress_jax.data.corpus import build_corpus, write_jsonl
    from xpress_jax.data.dataset import read_records
    from xpress_jax.generate.regenerate import regenerate
    r = config.reproduce
    sample = os.path.join(run, "regen", "questions.jsonl")
    if not os.path.isfile(sample):  # fixed once, so a resumed stage continues the same sample
        corpus = os.path.join(stage_dir(config, run, "target"), "corpus_train.jsonl")
        if os.path.isfile(corpus):
            records = read_records([corpus])
        else:
            p = config.pretrain
            records = build_corpus(code_functions=p.code_functions, val_fraction=p.val_fraction)[0]
        order = np.random.default_rng(config.seed).permutation(len(records))[:r.regen_records]
        write_jsonl([records[i] for i in order], sample)
    return regenerate(config, sample, os.path.join(run, "regen"), batch_size=r.regen_batch_size,
                      max_new_tokens=r.regen_max_new_tokens, max_prompt_tokens=config.data.max_len - 16)


def trained_methods(config, run: str, dloop_branches=(1,)):
    """Every trained or shipped stage's export as a method; D-Loop ones once per branch count in
    eval.dloop_branches."""
    from xpress_jax.eval.evaluate import Method, with_branches
    return with_branches([Method(label, label.split(".")[0], export_dir(config, run, label))
                          for label in method_stages(config)], dloop_branches)


def eval_passes(config, run: str) -> list[tuple[str, EvalSettings]]:
    """(name, eval settings) of each eval pass: every temperature with whole blocks verified (the
    papers' tau), then, with reproduce.speed_verify_tokens = m > 0, every temperature again with
    the target verifying each block's first m drafts (`T0_v4`), for wall-clock speed only (no
    iteration sweep or candidate mode)."""
    m = int(config.reproduce.speed_verify_tokens)
    base = EvalSettings.from_config(config.eval)
    passes = []
    for verify_tokens in (0, m) if m else (0,):
        for temperature in config.reproduce.temperatures:
            name = f"T{temperature:g}" + (f"_v{verify_tokens}" if verify_tokens else "")
            s = dataclasses.replace(base, temperature=float(temperature), verify_tokens=verify_tokens,
                                    out_dir=os.path.join(run, "eval", name))
            if temperature != 0 or verify_tokens:  # the iteration sweep and candidate mode at T = 0, whole blocks
                s = dataclasses.replace(s, iteration_sweep=(), candidate_k=0)
            passes.append((name, s))
    return passes


def evaluate_all(config, run: str) -> dict:
    from xpress_jax.eval.evaluate import evaluate
    out = {}
    for name, s in eval_passes(config, run):
        greedy = s.temperature == 0
        report, failures = evaluate(config, trained_methods(config, run, s.dloop_branches), s, check_lossless=greedy)
        if failures:
            raise RuntimeError(f"{name}: {failures} outputs at temperature 0 differ from target-only decoding")
        out[name] = report
    return {"passes": list(out)}


def _shown(path: str) -> str:
    """A shipped checkpoint's directory as the repository names it (xpress_jax/assets/...), else as given."""
    package_parent = os.path.dirname(os.path.dirname(assets.ASSETS))
    inside = os.path.commonpath([os.path.abspath(path), package_parent]) == package_parent
    return os.path.relpath(path, package_parent) if inside else path


def gather(config, run: str) -> dict:
    """Everything the reproduction measured, in one JSON: stage times, target quality, eval reports,
    and the shipped stages it started from (with their weights' digests)."""
    stages = {}
    for stage in pipeline(config):
        if is_done(run, stage):
            with open(_done_path(run, stage)) as f:
                stages[stage] = json.load(f)
    evals = {}
    for name in sorted(os.listdir(os.path.join(run, "eval"))) if os.path.isdir(os.path.join(run, "eval")) else []:
        path = os.path.join(run, "eval", name, "results.json")
        if os.path.isfile(path):
            with open(path) as f:
                evals[name] = json.load(f)
    target_report = {}
    target_json = os.path.join(stage_dir(config, run, "target"), "pretrain.json")
    if os.path.isfile(target_json):
        with open(target_json) as f:
            target_report = json.load(f)
    import jax
    return {"date": time.strftime("%Y-%m-%d"), "machine": {"device": jax.devices()[0].device_kind,
                                                           "cpu_count": os.cpu_count(), "platform": platform.platform(),
                                                           "python": platform.python_version(),
                                                           "jax": jax.__version__},
            "shipped": {s: {"dir": _shown(d), "weights_sha256": _stage_digest(config, run, s)}
                        for s, d in shipped(config).items()},
            "stage_seconds": {s: v["seconds"] for s, v in stages.items()},
            "total_seconds": round(sum(v["seconds"] for v in stages.values()), 1),
            "target": target_report, "eval": evals,
            "tau_vs_same_budget": {name: same_budget_ratios(report) for name, report in evals.items()}}


def _check_stages(config, wanted) -> None:
    from xpress_jax.errors import InputError
    unknown = [s for s in wanted if s not in STAGES]
    if unknown:
        raise InputError(f"unknown stages {unknown}; choose from {', '.join(STAGES)}")
    unknown = [s for s in config.reproduce.train_stages if s not in TRAIN_STAGES]
    if unknown:
        raise InputError(f"config field reproduce.train_stages names unknown stages {unknown}; choose from "
                         f"{', '.join(TRAIN_STAGES)}")
    for stage, path in shipped(config).items():
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise InputError(f"config field reproduce.{SHIPPABLE[stage]}={path!r} is not a checkpoint directory "
                             "(no config.json)")
    runs = pipeline(config)
    skipped = [s for s in wanted if s not in runs]
    if skipped:
        raise InputError(f"this config does not run {skipped} (shipped, or not in reproduce.train_stages); "
                         f"it runs {', '.join(runs)}")
    for stage in runs:
        missing = [n for n in needs(config, stage) if n not in runs and n not in shipped(config)]
        if missing:
            raise InputError(f"stage {stage} is built on {missing}, which this config neither runs nor ships "
                             "(reproduce.train_stages, reproduce.target_from, reproduce.dflash_from)")


def reproduce(config, run: str, stages=None) -> dict:
    runs = pipeline(config)
    wanted = list(stages or runs)
    _check_stages(config, wanted)
    os.makedirs(run, exist_ok=True)
    cli.log_to_file(os.path.join(run, "log.txt"))
    for stage in runs:
        if stage not in wanted:
            continue
        if is_done(run, stage):
            stale = stale_reason(config, run, stage)
            if stale:
                from xpress_jax.errors import InputError
                later = [s for s in STAGES[STAGES.index(stage) + 1:] if is_done(run, s)]
                raise InputError(f"{os.path.join(run, stage)} is finished but {stale}; delete it"
                                 + (f" and the stages after it ({', '.join(later)})" if later else "")
                                 + " to redo it, or pass another --out")
            print(f"[{stage}] done already (cached in {os.path.join(run, stage)})", file=sys.stderr)
            continue
        missing = [s for s in needs(config, stage) if not available(config, run, s)]
        if missing:
            from xpress_jax.errors import InputError
            raise InputError(f"stage {stage} needs {missing} first")
        print(f"[{stage}] running", file=sys.stderr)
        os.makedirs(os.path.join(run, stage), exist_ok=True)
        t0 = time.perf_counter()
        try:
            summary = run_stage(config, run, stage)
        finally:  # an interrupted stage's time still counts when it resumes
            seconds = _add_elapsed(run, stage, time.perf_counter() - t0)
        if summary.get("step", 0) < summary.get("steps", 0):  # stopped early (SIGTERM): resume next time
            print(f"[{stage}] stopped at step {summary['step']} of {summary['steps']}; run again to resume",
                  file=sys.stderr)
            break
        _mark_done(config, run, stage, seconds, summary)
        print(f"[{stage}] done in {seconds / 60:.1f} min", file=sys.stderr)
    results = gather(config, run)
    atomic.write_json(os.path.join(run, "results.json"), results)
    atomic.write_text(os.path.join(run, "table.md"), table(results))
    return results


