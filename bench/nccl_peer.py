"""torch.distributed's NCCL collectives, the peer of bench_collectives (the multi-GPU issue's bandwidth figure).

Started like bench_collectives, one process per GPU with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set (tests/distributed/run_tcp.sh sets them; so does torchrun):

    bash tests/distributed/run_tcp.sh 2 python3 bench/nccl_peer.py          (bench/gpu.sh nccl)

The same messages as bench_collectives (--min-mib to --max-mib, x4 steps, f32 and bf16), in device memory as
PyTorch keeps them, each checked first (rank r sends r + 1); a sample is one collective between barriers, timed
on the host around a device synchronize; the median of --reps samples after 2 warm-up calls. Rank 0 prints one
JSON line per message with impl "torch_nccl" and NCCL's algbw and busbw.

    python3 bench/nccl_peer.py --compare RLX.txt TORCH.txt

prints the two runs' lines side by side: RLX's bus bandwidth over PyTorch's per message (the issue's target is
0.9x). Lines that are not JSON (run_tcp.sh's "[rank 0] " prefix is stripped) are skipped.
"""
import argparse
import json
import os
import time


def read_runs(path: str) -> dict:
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.split("] ", 1)[1] if line.startswith("[rank") else line
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if isinstance(j, dict) and "workload" in j:
                rows[j["workload"]] = j
    return rows


def compare(rlx_path: str, torch_path: str) -> None:
    rlx, peer = read_runs(rlx_path), read_runs(torch_path)
    print(f"{'message':<26} {'RLX busbw GB/s':>15} {'torch busbw GB/s':>17} {'ratio':>7}")
    for w, j in rlx.items():
        p = peer.get(w)
        ratio = f"{j['busbw_gbps'] / p['busbw_gbps']:.2f}x" if p else "-"
        print(f"{w:<26} {j['busbw_gbps']:>15.2f} {p['busbw_gbps'] if p else float('nan'):>17.2f} {ratio:>7}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-mib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compare", nargs=2, metavar=("RLX", "TORCH"))
    a = ap.parse_args()
    if a.compare:
        return compare(*a.compare)
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", init_method="env://", device_id=torch.device("cuda", local))
    n, r = dist.get_world_size(), dist.get_rank()
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        esize = torch.tensor([], dtype=dtype).element_size()
        mib = a.min_mib
        while mib <= a.max_mib:
            nbytes = mib << 20
            count = nbytes // esize
            part = count // n
            data = torch.full((count,), float(r + 1), dtype=dtype, device="cuda")
            src = torch.full((part,), float(r + 1), dtype=dtype, device="cuda")
            out = torch.empty((part * n,), dtype=dtype, device="cuda")
            cases = [
                ("all_reduce", lambda: dist.all_reduce(data), 2.0 * (n - 1) / n, nbytes),
                ("all_gather", lambda: dist.all_gather_into_tensor(out, src), (n - 1) / n, part * n * esize),
            ]
            for cname, once, bus, moved in cases:
                workload = f"{cname}_{mib}mib_{name}"
                data.fill_(float(r + 1))
                once()
                torch.cuda.synchronize()
                if cname == "all_reduce":
                    ok = bool((data == n * (n + 1) / 2).all())
                else:
                    want = torch.arange(1, n + 1, dtype=dtype, device="cuda").repeat_interleave(part)
                    ok = bool((out == want).all())
                if not ok:
                    raise SystemExit(f"nccl_peer: {workload} gave a wrong result")
                once()
                seconds = []
                for _ in range(a.reps):
                    dist.barrier()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    once()
                    torch.cuda.synchronize()
                    seconds.append(time.perf_counter() - t0)
                seconds.sort()
                median = seconds[len(seconds) // 2]
                if r == 0:
                    print(json.dumps({"workload": workload, "impl": "torch_nccl", "median_s": median, "bytes": moved,
                                      "ranks": n, "algbw_gbps": moved / median * 1e-9,
                                      "busbw_gbps": moved / median * 1e-9 * bus}), flush=True)
            mib *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
