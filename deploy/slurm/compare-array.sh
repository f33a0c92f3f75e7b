#!/bin/bash
# `routelab compare` split over a Slurm job array: array task K of 1-N runs `--shard K/N` and
# writes one partial. Steps and the merge: docs/scale-out.md. Submit from the repository root
# (or any directory holding scenarios/ and data/), with `routelab` on the PATH:
#
#   jid=$(sbatch --parsable deploy/slurm/compare-array.sh)
#   sbatch --dependency=afterok:$jid --wrap "routelab merge out/partials/$jid/shard-*.json --out out/compare"
#
# afterok: the merge starts only once every array task has succeeded. If a task fails, the
# merge stays pending (DependencyNeverSatisfied): cancel it, run the failed index again into
# the same directory and make the merge depend on that job instead:
#   rerun=$(sbatch --parsable --array=3 --export=ALL,ROUTELAB_RUN=$jid deploy/slurm/compare-array.sh)
#
# N is written twice: in `--array=1-N` and in `shards=N` below (tests/integration/deploy.rs
# checks they agree).
#SBATCH --job-name=routelab-compare
#SBATCH --array=1-8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=%x-%A_%a.log
set -euo pipefail

shards=8
if [ "${SLURM_ARRAY_TASK_ID}" -lt 1 ] || [ "${SLURM_ARRAY_TASK_ID}" -gt "${shards}" ]; then
  echo "array task ${SLURM_ARRAY_TASK_ID} is not a shard: declare the array as --array=1-${shards}" >&2
  exit 2
fi
# One directory per run (the array's job id), so partials of an earlier run are never merged
# with these; a rerun of one index names the original run in ROUTELAB_RUN.
partials="out/partials/${ROUTELAB_RUN:-${SLURM_ARRAY_JOB_ID}}"
mkdir -p "$partials"
# The simulator's thread pool (rayon) would otherwise size itself to the node's CPUs, not the
# ones Slurm allots to this task (--cpus-per-task).
export RAYON_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
exec routelab compare scenarios/seed/*.yaml --seeds 5 \
  --shard "${SLURM_ARRAY_TASK_ID}/${shards}" \
  --partial "${partials}/shard-${SLURM_ARRAY_TASK_ID}-of-${shards}.json"
