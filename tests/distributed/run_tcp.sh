#!/usr/bin/env bash
# run_tcp.sh NP PROGRAM [ARGS...]: PROGRAM as NP ranks started the way torchrun-style launchers start them: NP
# processes of this host, each with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a MASTER_PORT that
# was free a moment ago, so rlx::distributed::init() picks the tcp engine. Each rank's output is printed after
# all have exited, prefixed with its rank; the exit status is the first failing rank's (0 when all pass).
# RUN_TCP_ENGINE=nccl makes the ranks ask for the nccl engine, one GPU each (LOCAL_RANK), which meets through
# the same store: the multi-GPU run of docs/distributed.md.
set -euo pipefail
np=$1
shift
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Not mpirun's children, whatever started this script.
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK RLX_DISTRIBUTED
if [ -n "${RUN_TCP_ENGINE:-}" ]; then export RLX_DISTRIBUTED=$RUN_TCP_ENGINE; fi
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$np
# A rank that fails leaves the others waiting at most this long (one that exits is noticed at once).
export RLX_DISTRIBUTED_TIMEOUT=${RLX_DISTRIBUTED_TIMEOUT:-120}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((r = 0; r < np; r++)); do
  RANK=$r LOCAL_RANK=$r "$@" >"$logs/$r" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < np; r++)); do
  rc=0
  wait "${pids[$r]}" || rc=$?
  if [ "$rc" != 0 ] && [ "$status" = 0 ]; then status=$rc; fi
  sed "s/^/[rank $r] /" "$logs/$r"
  echo "[rank $r] exit status $rc"
done
exit "$status"
