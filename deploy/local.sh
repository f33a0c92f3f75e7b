#!/bin/sh
# The one-machine equivalent of the Kubernetes and Slurm deployments: run a command's N shards
# as separate processes, P at a time, then merge them. See docs/scale-out.md.
#
#   deploy/local.sh N COMMAND ARGS...
#   deploy/local.sh 4 compare scenarios/seed/*.yaml --seeds 5
#
# Environment: PARALLEL (shards at once, default 2), PARTIALS (directory for the partials,
# default out/partials/local-N; emptied first), MERGE_OUT (passed to merge as --out),
# ROUTELAB (the binary, default routelab).
set -eu
if [ "$#" -lt 2 ]; then
  echo "usage: $0 N COMMAND ARGS..." >&2
  exit 2
fi
N=$1
shift
ROUTELAB=${ROUTELAB:-routelab}
PARALLEL=${PARALLEL:-2}
PARTIALS=${PARTIALS:-out/partials/local-$N}
rm -rf "$PARTIALS"
mkdir -p "$PARTIALS"
# xargs exits non-zero (123) when any shard fails; set -e then stops before the merge.
seq 1 "$N" | xargs -P "$PARALLEL" -I{} "$ROUTELAB" "$@" --shard {}/"$N" --partial "$PARTIALS"/shard-{}-of-"$N".json
exec "$ROUTELAB" merge "$PARTIALS"/shard-*-of-"$N".json ${MERGE_OUT:+--out "$MERGE_OUT"}
