"""The `ragspec bench --plot` figure: speedup per question per method, and how many draft tokens
each verify step accepted. matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path

from ragspec.bench.runner import BASELINE
from ragspec.bench.summary import entry_speedup


def plot(results: dict, path: str | Path) -> Path:
    """PNG: speedup per question per method (left), accepted-length histogram (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8),
                                      gridspec_kw={"width_ratios": [3, 2]})
    _speedups(left, results)
    _accepted_lengths(right, results)
    fig.suptitle(f"{results['model']} on {results['device']}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _speedups(ax, results: dict) -> None:
    entries = results["questions"]
    shown = [m for m in results["methods"] if m in BASELINE and m != "greedy"]
    width = 0.8 / max(1, len(shown))
    for j, method in enumerate(shown):
        xs = [i + (j - (len(shown) - 1) / 2) * width for i in range(len(entries))]
        ys = [entry_speedup(e, method) or 0.0 for e in entries]
        ax.bar(xs, ys, width=width, label=f"{method} (vs {BASELINE[method]})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.97, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels([f"{e['id']}\n({e['kind']})" for e in entries], fontsize=7)
    ax.set_ylabel("end-to-end speedup (tokens/s ratio)")
    ax.set_title(f"speedup per question, {results['max_new_tokens']} new tokens")
    top = max((entry_speedup(e, m) or 0.0 for e in entries for m in shown), default=1.0)
    ax.set_ylim(0, max(1.2, top) * 1.3)  # headroom so the legend covers no bar
    ax.legend(fontsize=8, ncol=2, loc="upper left")


def _accepted_lengths(ax, results: dict) -> None:
    from matplotlib.ticker import MaxNLocator

    drafting = [m for m in ("ragspec", "oracle") if m in results["methods"]]
    hists = []
    for method in drafting:
        h: dict[int, int] = {}
        for e in results["questions"]:
            for length, count in e["results"][method].get("accepted_lengths", {}).items():
                h[int(length)] = h.get(int(length), 0) + count
        hists.append(h)
    top = max((max(h) for h in hists if h), default=0)
    width = 0.8 / max(1, len(drafting))
    for j, (method, h) in enumerate(zip(drafting, hists, strict=True)):
        xs = [a + (j - (len(drafting) - 1) / 2) * width for a in range(top + 1)]
        ax.bar(xs, [h.get(a, 0) for a in range(top + 1)], width=width, label=method)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft tokens accepted in one verify step")
    ax.set_ylabel("verify steps (all questions)")
    ax.set_title("accepted-length histogram")
    ax.legend(fontsize=8)
