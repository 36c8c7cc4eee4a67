#!/usr/bin/env python3
"""bench/report.py's ratio rows on synthetic records: speeds, targets met and missed, and the training step's
backward + update over forward with its upper-bound target (docs/performance.md, "Reading the table")."""
import importlib.util
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
spec = importlib.util.spec_from_file_location("report", root / "bench" / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def record(workload, impl, median_s):
    return {"workload": workload, "impl": impl, "median_s": median_s}


def rows(records):
    return {(x["workload"], x["peer"]): x for x in report.compare(records)}


def check(cond, what):
    if not cond:
        raise SystemExit(f"check_bench_report: {what}")


sgd = "train_sgd_mlp_b64_w1024_l2"
for step, want, verdict in ((4.5e-3, 2.0, "met"), (6.0e-3, 3.0, "MISSED")):
    r = rows([record(sgd, "rlx", step), record(sgd, "rlx_forward", 1.2e-3), record(sgd, "rlx_forward_as_inputs", 1.5e-3)])
    x = r[(sgd, "rlx_forward_as_inputs")]
    check(abs(x["backward_over_forward"] - want) < 1e-9, f"backward over forward {x['backward_over_forward']} != {want}")
    check(x["backward_target"] == 2.5, "the SGD step's target is backward + update <= 2.5x forward")
    check("backward_target" not in r[(sgd, "rlx_forward")], "only the forward with weights as inputs has the target")
    line = next(l for l in report.table({"records": [record(sgd, "rlx", step), record(sgd, "rlx_forward", 1.2e-3),
                                                      record(sgd, "rlx_forward_as_inputs", 1.5e-3)],
                                         "ratios": list(r.values()), "checks": {},
                                         "machine": {"peak_gflops": 1, "copy_gbps": 1}, "date": "now"}).splitlines()
                if "rlx_forward_as_inputs" in l)
    check(f"target <= 2.5x: {verdict}" in line, f"the table's row says {line!r}, not {verdict}")

chain = "elementwise_chain8_16M"
r = rows([record(chain, "rlx", 1.0), record(chain, "memcpy", 0.5)])
check(r[(chain, "memcpy")]["speed_ratio"] == 0.5 and r[(chain, "memcpy")]["target"] == 0.7, "the chain's row")
print("check_bench_report: ok")
