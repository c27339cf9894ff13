# Two "nodes" on one machine for the integration tests that source it
# (after lib.sh): network namespaces ns0 and ns1 joined by a veth pair,
# v0 (address a0) in ns0 and v1 (address a1) in ns1, each namespace with
# its loopback up and the other's address routed through its veth end.
#
#   netns_make           needs root and `ip netns`, otherwise exits 77
#                        (ctest SKIP_RETURN_CODE) with the reason; sets
#                        ns0 ns1 v0 v1 a0 a1 and installs netns_teardown
#                        as the EXIT trap
#   netns_teardown       kills the pids in the caller's `pids` array and
#                        every process left in either namespace, removes
#                        the namespaces and the veth pair (whatever happened)
#   netns_procs          the pids of every process in either namespace
#   netns_nothing_left NAME GLOB...
#                        checks: no process in either namespace, no entry
#                        of /dev/shm matching a GLOB
#
# Names carry the test's pid, so tests running side by side get their own
# pair; the addresses may repeat (each pair lives in namespaces of its own).
ns0=dtn$$a ns1=dtn$$b v0=dtv$$a v1=dtv$$b
a0=10.77.0.1 a1=10.77.0.2
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
  local name=$1 left g
  shift
  left=$(netns_procs)
  if [ -z "${left// /}" ]; then ok "$name: no process left in the namespaces"
  else bad "$name: processes left in the namespaces: $left" "$(ps -o pid,args -p "${left// /,}")"; fi
  left=""
  for g in "$@"; do left+=$(find /dev/shm -maxdepth 1 -name "$g" 2>/dev/null); done
  if [ -z "$left" ]; then ok "$name: nothing of the job in /dev/shm ($*)"
  else bad "$name: left in /dev/shm" "$left"; fi
}
