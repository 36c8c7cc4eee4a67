#!/usr/bin/env bash
# run_mpi.sh NP PROGRAM [ARGS...]: PROGRAM as NP ranks under OpenMPI's mpirun on loopback (shared memory between
# processes of this host), each rank on whichever core is free. Exits 77, which CTest counts as skipped, when
# mpirun is not installed.
set -euo pipefail
np=$1
shift
if ! command -v mpirun >/dev/null; then
  echo "SKIPPED: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
  exit 77
fi
extra=()
if [ "$(id -u)" = 0 ]; then extra+=(--allow-run-as-root); fi
# vader's single-copy mechanism (CMA) is often refused inside containers; plain copies work everywhere. Ranks yield
# the core while they wait, so a rank that shares a core (with the other, or with other work) is not starved.
exec mpirun -np "$np" --oversubscribe --bind-to none "${extra[@]}" \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 "$@"
