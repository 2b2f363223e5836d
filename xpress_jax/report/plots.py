"""PNG plots of evaluation results (matplotlib, headless)."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from xpress_jax.report import published  # noqa: E402


def _panels(count: int, width: float = 5.0, height: float = 3.6):
    """A figure with `count` side-by-side panels: (figure, list of axes)."""
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, list(axes[0])


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finish(ax, legend: bool = True, axis: str = "both") -> None:
    ax.grid(alpha=0.3, axis=axis)
    if legend:
        ax.legend(fontsize=8)


def acceptance_per_position(results: dict, path: str) -> None:
    """One panel per dataset: acceptance rate at each draft position, a line per head."""
    datasets = list(results)
    fig, axes = _panels(len(datasets), 5, 3.6)
    for ax, ds in zip(axes, datasets):
        for head, r in results[ds].items():
            if r["accept_per_position"]:
                ax.plot(range(1, len(r["accept_per_position"]) + 1), r["accept_per_position"], marker="o",
                        ms=3, label=f"{head} (tau {r['tau']:.2f})")
        ax.set(title=ds, xlabel="draft position k", ylabel="acceptance rate", ylim=(0, 1.02))
        _finish(ax)
    _save(fig, path)


def by_benchmark(results: dict, path: str) -> None:
    """The papers' table as bars: per benchmark, each method's tau and speedup as the DFlash harness
    reports them (tau_per_prompt_mean, speedup_harness), one group of bars per benchmark."""
    datasets = list(results)
    labels = list(dict.fromkeys(label for rows in results.values() for label in rows if label != "target"))
    fig, axes = _panels(2, max(5.0, 1.2 * len(datasets)), 3.6)
    width = 0.8 / max(len(labels), 1)
    for ax, key, title in ((axes[0], "tau_per_prompt_mean", "tau (mean over responses)"),
                           (axes[1], "speedup_harness", "speedup (decode time per token)")):
        for i, label in enumerate(labels):
            values = [results[ds].get(label, {}).get(key) or 0.0 for ds in datasets]
            ax.bar([d + (i - (len(labels) - 1) / 2) * width for d in range(len(datasets))], values, width,
                   label=label)
        ax.set_xticks(range(len(datasets)), [os.path.basename(ds) for ds in datasets], rotation=30, ha="right")
        ax.set(title=title)
        if key == "speedup_harness":
            ax.axhline(1.0, color="black", lw=0.8)
        _finish(ax, axis="y")
    _save(fig, path)


def tau_against_iterations(sweep: dict, reference: dict, path: str, published_plateau: float | None = None) -> None:
    """tau of each XPress method against its Jacobi iterations, with the other methods as flat lines,
    and one legend for all panels beside them (a dozen lines would hide a panel's own). With
    `published_plateau` (the XPress paper's mean tau over the Markov head's at its plateau), the
    paper's curve as its text states it: the run's Markov tau times that ratio from K = 7 on."""
    datasets = list(sweep)
    fig, axes = _panels(len(datasets), 5, 3.6)
    for ax, ds in zip(axes, datasets):
        labels = list(sweep[ds]) + list(reference.get(ds, {}))
        palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20").colors  # one color per method
        colors = [palette[i % len(palette)] for i in range(len(labels))]
        for label, by_k in sweep[ds].items():  # one line per XPress method
            ks = sorted(int(k) for k in by_k)
            ax.plot(ks, [by_k[str(k)] for k in ks], marker="o", label=label, color=colors[labels.index(label)])
        for head, tau in reference.get(ds, {}).items():
            ax.axhline(tau, ls="--", lw=1, label=head, color=colors[labels.index(head)])
        markov = next((tau for head, tau in reference.get(ds, {}).items() if head.split(".")[0] == "markov"), None)
        if published_plateau is not None and markov is not None:
            start = published.XPRESS_PLATEAU_FROM_K
            ks = [k for k in sorted({int(k) for by_k in sweep[ds].values() for k in by_k} | {start}) if k >= start]
            # the paper's ratio is of tau without the bonus token: scale the accepted drafts, then add it back
            ax.plot(ks, [1 + (markov - 1) * published_plateau] * len(ks), ls=":", lw=2, color="black", marker="s",
                    label=f"XPress paper: Markov's drafts x {published_plateau:.2f} (K >= {start})")
        ax.set(title=ds, xlabel="Jacobi iterations", ylabel="tau (acceptance length)")
        _finish(ax, legend=False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def latency_against_iterations(heads_result: dict, path: str) -> None:
    """Exact XPress latency against Jacobi iterations with the serial heads and candidate mode as flat lines
    (the XPress paper's Figure 3), one panel per batch size."""
    batches = list(heads_result["batches"])
    fig, axes = _panels(len(batches), 5, 3.6)
    for ax, batch in zip(axes, batches):
        sec = heads_result["batches"][batch]["seconds"]
        ks = sorted(int(k[len("xpress_it"):]) for k in sec if k[len("xpress_it"):].isdigit())
        ax.plot(ks, [sec[f"xpress_it{k}"] * 1e3 for k in ks], marker="o", label="XPress exact")
        for i, (name, label) in enumerate((("markov", "Markov (serial)"), ("gru", "GRU (serial)"),
                                           ("xpress_it4_early_stop", "XPress <= 4 iterations, early stop"),
                                           ("xpress_it4_top32", "XPress 4 iterations, top-32"))):
            ax.axhline(sec[name] * 1e3, ls="--", lw=1, color=f"C{i + 1}", label=label)
        ax.set(title=f"batch {batch}", xlabel="Jacobi iterations", ylabel="ms per block", ylim=(0, None))
        _finish(ax)
    _save(fig, path)


def draft_step_breakdown(heads_result: dict, path: str) -> None:
    """One draft step per method as stacked bars: drafter forward + LM-head readout + the head's
    solve (the XPress paper's Figure 5), one panel per batch size."""
    batches = list(heads_result["batches"])
    fig, axes = _panels(len(batches), 5.5, 3.8)
    methods = (("dflash", None), ("markov", "markov"), ("gru", "gru"), ("xpress 4 it.", "xpress_it4"),
               ("xpress early", "xpress_it4_early_stop"), ("xpress top-32", "xpress_it4_top32"))
    for ax, batch in zip(axes, batches):
        sec = heads_result["batches"][batch]["seconds"]
        x = range(len(methods))
        fwd = [sec["drafter_forward"] * 1e3] * len(methods)
        lm = [sec["lm_head"] * 1e3] * len(methods)
        head = [sec[key] * 1e3 if key else 0.0 for _, key in methods]
        ax.bar(x, fwd, label="drafter forward")
        ax.bar(x, lm, bottom=fwd, label="LM-head readout")
        ax.bar(x, head, bottom=[a + b for a, b in zip(fwd, lm)], label="head solve")
        ax.set_xticks(list(x), [m for m, _ in methods], rotation=30, ha="right", fontsize=8)
        ax.set(title=f"batch {batch}", ylabel="ms per draft step")
        _finish(ax, axis="y")
    _save(fig, path)


def e2e_speed(e2e_result: dict, path: str) -> None:
    """Tokens/s of every method against target-only decoding, and each head's solve latency on
    real blocks relative to the Markov head."""
    fig, (left, right) = _panels(2, 5.5, 3.8)
    decode = e2e_result["decode"]
    labels = list(decode)
    left.bar(range(len(labels)), [decode[k]["tokens_per_s"] for k in labels],
             color=["grey" if k == "target" else "C0" for k in labels])
    left.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    left.set(title="decoding (GSM8K, T = 0)", ylabel="tokens/s")
    _finish(left, legend=False, axis="y")
    for i, batch in enumerate(e2e_result["real_blocks"]["by_batch"]):
        ratio = e2e_result["real_blocks"]["by_batch"][batch]["ratio_to_markov"]
        names = list(ratio)
        right.bar([j + 0.4 * i for j in range(len(names))], [ratio[n] for n in names], width=0.4,
                  label=f"batch {batch}")
        right.set_xticks([j + 0.2 for j in range(len(names))], names, rotation=30, ha="right", fontsize=8)
    right.axhline(1.0, color="grey", lw=1, ls="--")
    right.set(title="head solve on real blocks", ylabel="latency / Markov")
    _finish(right, axis="y")
    _save(fig, path)


def break_even_tau(decode_result: dict, path: str) -> None:
    """One panel per batch size: each decoder's break-even tau (its step over a target-only step),
    a bar group per context length. A drafter pays off where its measured tau is above its bar."""
    contexts = list(decode_result["contexts"])
    batches = list(decode_result["contexts"][contexts[0]])
    fig, axes = _panels(len(batches), 6, 3.8)
    width = 0.8 / len(contexts)
    for ax, batch in zip(axes, batches):
        labels = [k for k in decode_result["contexts"][contexts[0]][batch] if k != "target"]
        for i, context in enumerate(contexts):
            rows = decode_result["contexts"][context][batch]
            ax.bar([j + width * i for j in range(len(labels))], [rows[k]["break_even_tau"] for k in labels],
                   width=width, label=f"{context} context tokens")
        ax.set_xticks([j + width * (len(contexts) - 1) / 2 for j in range(len(labels))], labels, rotation=30,
                      ha="right", fontsize=8)
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set(title=f"batch {batch}: tau needed to match target-only decoding", ylabel="break-even tau")
        _finish(ax, axis="y")
    _save(fig, path)


def scaling(scaling_result: dict, path: str) -> None:
    """Per-device temporaries and FLOPs against devices, strong and weak scaling, each beside
    its ideal (an even split: 1/devices of the first row for strong, flat for weak)."""
    fig, axes = _panels(2, 5, 3.6)
    for ax, key, label in ((axes[0], "temp_gib", "temporaries per device (GiB)"),
                           (axes[1], "flops_per_device", "FLOPs per device")):
        for kind, marker in (("strong", "o"), ("weak", "s")):
            rows = scaling_result[kind]
            devices = [r["devices"] for r in rows]
            first = rows[0]
            ideal = [first[key] * (first["devices"] / n if kind == "strong" else 1) for n in devices]
            line, = ax.plot(devices, [r[key] for r in rows], marker=marker, label=f"{kind}")
            ax.plot(devices, ideal, ls="--", color=line.get_color(), alpha=0.6, label=f"{kind}, even split")
        ax.set(xscale="log", yscale="log", xlabel="devices", ylabel=label)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # only the device counts
        ax.set_xticks(devices, [str(n) for n in devices])
        _finish(ax)
    fig.suptitle(f"{scaling_result.get('config', '')}: strong batch {scaling_result['strong_global_batch']}, "
                 f"weak {scaling_result['weak_batch_per_device']} per device", fontsize=9)
    _save(fig, path)
