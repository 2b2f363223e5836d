"""`python -m xpress_jax.compare`: two methods paired over prompts, within one report or across
two, and the refusals that keep an unpaired comparison from being printed."""

import json

import pytest

from cli_helpers import invoke, run
from xpress_jax.compare.pairing import compare, read_side
from xpress_jax.errors import InputError
from xpress_jax.report.significance import paired_tau_ratio

SETTINGS = {"num_prompts": 4, "max_new_tokens": 32, "max_prompt_tokens": 512, "temperature": 0.0, "seed": 0,
            "batch_size": 1}


def row(committed, steps):
    return {"tau": sum(committed) / sum(steps), "per_prompt": {"committed": committed, "steps": steps}}


def report(methods, target_lengths=(30, 32, 12, 32), **settings):
    """An eval report over two datasets with a target-only row and the given methods."""
    rows = {"target": row(list(target_lengths), list(target_lengths)), **methods}
    return {"settings": {**SETTINGS, **settings}, "results": {"gsm8k": rows, "humaneval": dict(rows)}}


FAST = row([30, 32, 12, 32], [10, 11, 6, 9])
SLOW = row([30, 32, 12, 32], [14, 15, 7, 13])


def write(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return str(path)


def test_a_comparison_across_reports_equals_the_paired_bootstrap_of_the_two_rows(tmp_path):
    a = write(tmp_path, "a.json", report({"xpress": FAST}))
    b = write(tmp_path, "b.json", {"eval": {"T0": report({"dflash": SLOW})}})  # a reproduction's results.json
    result = compare(read_side(f"{a}:xpress"), read_side(f"{b}:T0:dflash"))
    expected = paired_tau_ratio(FAST["per_prompt"]["committed"], FAST["per_prompt"]["steps"],
                                SLOW["per_prompt"]["committed"], SLOW["per_prompt"]["steps"])
    assert set(result) == {"gsm8k", "humaneval"}
    assert result["gsm8k"]["ratio"] == expected["ratio"] and result["gsm8k"]["ci95"] == expected["ci95"]
    assert result["gsm8k"]["ratio"] == pytest.approx(FAST["tau"] / SLOW["tau"], abs=1e-4)
    assert result["gsm8k"]["ci95"][0] > 1.0  # FAST is faster on every prompt
    same = compare(read_side(f"{a}:xpress"), read_side(f"{a}:xpress"))
    assert same["gsm8k"]["ratio"] == 1.0 and same["gsm8k"]["ci95"] == [1.0, 1.0]


@pytest.mark.parametrize("case, message", [
    ("temperature", "differ in temperature"),
    ("target", "different answer lengths"),
    ("label", "no method 'markov'"),
    ("old", "no per-prompt figures"),
])
def test_unpaired_comparisons_are_refused(tmp_path, case, message):
    a = write(tmp_path, "a.json", report({"xpress": FAST}))
    other = {"temperature": report({"dflash": SLOW}, temperature=1.0),
             "target": report({"dflash": SLOW}, target_lengths=(30, 31, 12, 32)),
             "label": report({"dflash": SLOW}),
             "old": report({"dflash": {"tau": 2.0}})}[case]
    b = write(tmp_path, "b.json", other)
    with pytest.raises(InputError, match=message):
        compare(read_side(f"{a}:xpress"), read_side(f"{b}:{'markov' if case == 'label' else 'dflash'}"))


def test_a_reproduction_report_needs_its_temperature(tmp_path):
    b = write(tmp_path, "b.json", {"eval": {"T0": report({"dflash": SLOW})}})
    with pytest.raises(InputError, match=r"name the temperature .* one of \['T0'\]"):
        read_side(f"{b}:dflash")
    with pytest.raises(InputError, match="no such report"):
        read_side(f"{tmp_path}/missing.json:dflash")
    with pytest.raises(InputError, match="expected REPORT.json:LABEL"):
        read_side(b)


def test_cli_prints_the_table_writes_json_and_refuses_in_one_line(tmp_path):
    a = write(tmp_path, "a.json", report({"xpress": FAST, "dflash": SLOW}))
    out = tmp_path / "cmp.json"
    r = run("xpress_jax.compare", f"--method={a}:xpress", f"--reference={a}:dflash", f"--out={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| gsm8k | " in r.stdout and "| humaneval | " in r.stdout
    saved = json.loads(out.read_text())
    assert saved["results"]["gsm8k"]["ratio"] == pytest.approx(FAST["tau"] / SLOW["tau"], abs=1e-4)
    r = invoke("xpress_jax.compare", f"--method={a}:xpress", f"--reference={a}:gru")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no method 'gru'" in r.stderr
