#!/usr/bin/env python3
"""Bar chart of RLX speed ratios (peer time / RLX time) from bench/results/latest.json.

  plot.py [latest.json] [out.png]     skips, with a note, when matplotlib is not installed
"""
import json
import sys


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "bench/results/latest.json"
    out = sys.argv[2] if len(sys.argv) > 2 else "bench/results/ratios.png"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("plot.py: matplotlib not installed; skipping the chart")
        return
    with open(src) as f:
        result = json.load(f)
    ratios = result["ratios"]
    labels = [f"{r['workload']}\nvs {r['peer']}" for r in ratios]
    values = [r["speed_ratio"] for r in ratios]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(values)), 5))
    ax.bar(range(len(values)), values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for i, v in enumerate(values):
        ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(values)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speed ratio (peer time / RLX time; > 1 = RLX faster)")
    m = result["machine"]
    ax.set_title(f"RLX vs peers, {result['date']}, {m.get('cpu', '?')} x{m.get('cores', '?')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot.py: wrote {out}")


if __name__ == "__main__":
    main()
