# shellcheck shell=bash
# Two "nodes" on one machine for the integration tests that source it
# (after lib.sh): network namespaces ns0 and ns1 joined by a veth pair,
# v0 (address a0) in ns0 and v1 (address a1) in ns1, each namespace with
# its loopback up and the other's address routed through its veth end.
#
#   netns_make           needs root and `ip netns`, otherwise exits 77
#                        (ctest SKIP_RETURN_CODE) with the reason; sets
#                        ns0 ns1 v0 v1 a0 a1 and installs netns_teardown
#                        as the EXIT trap; also IPv6 addresses b0 and b1
#                        on the same link (fd77::1, fd77::2), or b0 empty
#                        and no6 the reason where IPv6 cannot be had
#   netns_teardown       kills the pids in the caller's `pids` array and
#                        every process left in either namespace, removes
#                        the namespaces and the veth pair (whatever happened)
#   netns_procs          the pids of every process in either namespace
#   netns_nothing_left NAME GLOB...
#                        checks: no process in either namespace, no entry
#                        of /dev/shm matching a GLOB (each waited for up to
#                        10 s: a daemon may tidy up moments after the job)
#   netns_mpirun_setup DIR MPIEXEC
#                        Open MPI across the two nodes: writes DIR/agent.sh
#                        and DIR/hosts (see netns_mpirun)
#   netns_mpirun LIMIT NODES SLOTS ARGS...
#                        MPIEXEC from ns0 (host name node0) with -np
#                        NODES x SLOTS over the first NODES nodes, killed
#                        after LIMIT seconds (timeout -k 2); ARGS is the
#                        program and its arguments (mpirun options first)
#   rx_bytes             bytes node 0's end of the link has received
#   dtrain_ranks         the pids of dtrain processes in the namespaces
#   newest_ckpt DIR      the newest complete checkpoint in DIR
#   since T0             seconds since T0 (date +%s.%N), one decimal
#
# Names carry the test's pid, so tests running side by side get their own
# pair; the addresses may repeat (each pair lives in namespaces of its own).
ns0=dtn$$a ns1=dtn$$b v0=dtv$$a v1=dtv$$b
a0=10.77.0.1 a1=10.77.0.2
b0=fd77::1 b1=fd77::2 no6=""
pids=()

netns_procs() { echo $(ip netns pids "$ns0" 2>/dev/null) $(ip netns pids "$ns1" 2>/dev/null); }

netns_teardown() {
  local p ns
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for ns in "$ns0" "$ns1"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$v0" 2>/dev/null || true
}

netns_make() {
  local err pair
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root (this test runs as uid $(id -u))"
    exit 77
  fi
  trap netns_teardown EXIT
  if ! err=$(ip netns add "$ns0" 2>&1); then
    echo "SKIP: cannot make a network namespace here: $err"
    exit 77
  fi
  ip netns add "$ns1"
  ip link add "$v0" type veth peer name "$v1"
  ip link set "$v0" netns "$ns0"
  ip link set "$v1" netns "$ns1"
  ip -n "$ns0" addr add "$a0/24" dev "$v0"
  ip -n "$ns1" addr add "$a1/24" dev "$v1"
  for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
  # IPv6 beside: nodad, or the addresses stay tentative for a second
  if ! no6=$(ip -n "$ns0" addr add "$b0/64" dev "$v0" nodad 2>&1 &&
             ip -n "$ns1" addr add "$b1/64" dev "$v1" nodad 2>&1); then
    b0="" b1=""
    no6="no IPv6 on the veth pair: ${no6:-ip addr add failed}"
  fi
  ip -n "$ns0" link set "$v0" up
  ip -n "$ns1" link set "$v1" up
  # each namespace reaches the other's address only through the veth pair
  # (and the host reaches neither): the job cannot go another way
  for pair in "$ns0 $a1 $v0" "$ns1 $a0 $v1"; do
    set -- $pair
    if ip netns exec "$1" ip route get "$2" | grep -q "dev $3"; then ok "$1 routes $2 through $3"
    else bad "$1 does not route $2 through $3" "$(ip netns exec "$1" ip route)"; fi
  done
}

netns_nothing_left() {
  local name=$1 left g i
  shift
  # a process being torn down (an Open MPI daemon reaping its children)
  # may outlive the job by moments on a loaded machine: bounded, 10 s
  left=$(netns_procs)
  for ((i = 0; i < 100 && ${#left} > 0; i++)); do
    [ -z "${left// /}" ] && break
    sleep 0.1
    left=$(netns_procs)
  done
  if [ -z "${left// /}" ]; then ok "$name: no process left in the namespaces"
  else bad "$name: processes left in the namespaces: $left" "$(ps -o pid,args -p "${left// /,}")"; fi
  # Open MPI's daemons unlink their segments as they go, moments after the
  # job's last process: bounded the same way
  for ((i = 0; i < 100; i++)); do
    left=""
    for g in "$@"; do left+=$(find /dev/shm -maxdepth 1 -name "$g" 2>/dev/null); done
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -z "$left" ]; then ok "$name: nothing of the job in /dev/shm ($*)"
  else bad "$name: left in /dev/shm" "$left"; fi
}

# How mpirun reaches the second node: a launch agent (plm_rsh_agent, in
# place of ssh) runs `agent HOST CMD...` as ssh would, CMD one string for a
# shell, inside HOST's namespace.  Each node gets a host name of its own
# (unshare --uts: node0, node1): the namespaces share the UTS namespace and
# /dev/shm, and with one host name Open MPI takes all ranks for one machine
# and points vader (its shared memory BTL) across the nodes, which crashes
# in mca_btl_vader_poll_handle_frag.  So vader only inside a node, TCP
# between them, over the veth subnet only (btl_tcp_if_include,
# oob_tcp_if_include); no single-copy (CMA) mechanism, as in
# test_mpi_run.sh.
netns_mpirun_setup() {
  netns_dir=$1 netns_mpiexec=$2
  cat > "$netns_dir/agent.sh" <<A
#!/bin/sh
case "\$1" in
  $a0) ns=$ns0 name=node0 ;;
  $a1) ns=$ns1 name=node1 ;;
  *) echo "agent: no node \$1" >&2; exit 1 ;;
esac
shift
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name && \$*"
A
  chmod +x "$netns_dir/agent.sh"
}

netns_mpirun() {
  local limit=$1 nodes=$2 slots=$3 subnet=${a0%.*}.0/24
  shift 3
  printf '%s slots=%s\n' "$a0" "$slots" > "$netns_dir/hosts"
  [ "$nodes" -lt 2 ] || printf '%s slots=%s\n' "$a1" "$slots" >> "$netns_dir/hosts"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout -k 2 "$limit" ip netns exec "$ns0" unshare --uts sh -c 'hostname node0 && exec "$@"' sh \
    "$netns_mpiexec" --hostfile "$netns_dir/hosts" -np $((nodes * slots)) --bind-to none \
    --mca plm_rsh_agent "$netns_dir/agent.sh" \
    --mca btl tcp,self,vader --mca btl_vader_single_copy_mechanism none \
    --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" "$@"
}
# rx_bytes: bytes node 0's end of the link has received
rx_bytes() { ip -n "$ns0" -s -j link show "$v0" | grep -o '"rx":{"bytes":[0-9]*' | grep -o '[0-9]*$'; }
# dtrain_ranks: the pids of dtrain processes in the namespaces
dtrain_ranks() {
  local p
  for p in $(netns_procs); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dtrain ] && echo "$p"; done
  return 0
}
# newest_ckpt DIR: the newest complete checkpoint in DIR (saves in
# progress are step-N.tmp*)
newest_ckpt() {
  local d last=""
  for d in "$1"/step-*; do [[ $d =~ /step-[0-9]{8}$ ]] && last=$d; done
  echo "$last"
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
