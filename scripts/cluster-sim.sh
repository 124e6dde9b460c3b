#!/usr/bin/env bash
# A cluster on one machine: NODES fake nodes of RANKS_PER_NODE ranks each, TCP between them.
#
#   scripts/cluster-sim.sh NODES RANKS_PER_NODE [--rate RATE] -- command [args...]
#
# The command runs under `mpiexec -n NODES*RANKS_PER_NODE` (every rank runs it). MPICH's
# MPIR_CVAR_NUM_CLIQUES=NODES with MPIR_CVAR_CLIQUES_BY_BLOCK=1 makes
# MPI_Comm_split_type(SHARED) return blocks of RANKS_PER_NODE consecutive ranks, so fcoll's node
# detection and MPICH's own algorithms both see NODES nodes. Between them MPICH's ofi netmod
# sends over its tcp provider on `lo`, inside a private network namespace (`unshare -n`, then
# `ip link set lo up`): nothing leaves the machine. `--rate 10gbit` caps lo's bandwidth there
# with tc's tbf (netem, for latency, is not available here). Where `unshare -n` is refused the
# job runs on the default netmod (shared memory between the fake nodes) and says so on stderr.
#
# Examples:
#   scripts/cluster-sim.sh 2 2 -- .venv/bin/python examples/tour.py
#   scripts/cluster-sim.sh 4 1 --rate 10gbit -- .venv/bin/python bench/nodes.py --worker
# Environment: MPIEXEC (default: mpiexec on PATH), MPIEXEC_TIMEOUT (default 600 s),
# CLUSTER_SIM_PLACEMENT=roundrobin places ranks round-robin over the nodes instead of by block.
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 3 ] || usage
nodes=$1 per=$2
shift 2
rate=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ "${1:-}" = "--" ] || usage
shift
[[ "$nodes" =~ ^[1-9][0-9]*$ && "$per" =~ ^[1-9][0-9]*$ ]] || usage
n=$((nodes * per))
block=1
[ "${CLUSTER_SIM_PLACEMENT:-block}" = "roundrobin" ] && block=0

export MPIR_CVAR_NUM_CLIQUES=$nodes MPIR_CVAR_CLIQUES_BY_BLOCK=$block
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-600}
launcher=${MPIEXEC:-mpiexec}
bind=()
# More ranks than cores: MPICH's Hydra binds each to a core (as scripts/env.sh does), which
# keeps a waiting rank from wandering onto the core of a working one.
if [ "$n" -gt "$(nproc)" ] && "$launcher" --version 2>/dev/null | grep -q HYDRA; then
  bind=(-bind-to core)
fi
cmd=$(printf '%q ' "$launcher" ${bind[@]+"${bind[@]}"} -n "$n" "$@")

if command -v unshare >/dev/null && unshare -n true 2>/dev/null; then
  export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo
  shaping=""
  if [ -n "$rate" ]; then
    shaping="tc qdisc add dev lo root tbf rate $rate burst 256kb latency 50ms && "
  fi
  exec unshare -n bash -c "ip link set lo up && ${shaping}exec $cmd"
fi
echo "cluster-sim: unshare -n is refused here; $nodes fake nodes of $per ranks on the default" \
     "netmod (shared memory between them, no TCP)" >&2
exec bash -c "exec $cmd"
