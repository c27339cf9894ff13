#!/usr/bin/env bash
# The collective ledger across nodes (issue 27, item 3): two "nodes"
# (network namespaces joined by a veth pair, netns_lib.sh), `dtrain run
# --nnodes 2 --nproc 2` in each over comm = tcp, and global rank 2 (on
# node 1) issuing a broadcast in place of its all_reduce at step 2
# (DTRAIN_FAULT_DIVERGE, a test hook).  The ranks hand their ledgers to
# rank 0 over TCP at master_addr:master_port + 2
# (core/launch/ledger_exchange.c), proving the job secret:
#   - both nodes exit 1, and every rank that printed a ledger line printed
#     the same one, naming rank 2, the step and both calls; at least one
#     rank of node 1 did (its ledger crossed the link both ways);
#   - a stranger on node 1's side that connects to rank 0's ledger port and
#     sends a well-formed frame claiming rank 2 with a proof made from
#     another secret is refused: rank 0 logs it, and the line still names
#     the real rank 2's call;
#   - no process is left in either namespace.
# Needs root, `ip netns` and a build with test hooks; otherwise exits 77
# (skipped, with the reason).
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
if ! has_test_hooks "$bin"; then
  echo "SKIP: this build has no test hooks (DTRAIN_FAULT_DIVERGE)"; exit 77
fi
port=$((21000 + ($$ * 7) % 20000))
netns_make

rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer s.toml \
  '[run]' 'comm = "tcp"' \
  '[model]' 'n_head = 4' 'context = 16' \
  '[train]' 'steps = 4' 'micro_batch = 2' 'seq_len = 16' 'warmup_steps = 1' \
  '[checkpoint]' 'every = 0' \
  '[launch]' 'timeout = 3.0'
export DTRAIN_JOB_SECRET
DTRAIN_JOB_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

# node NS RANK LOG: `dtrain run` as node RANK inside namespace NS, in the
# background (its pid appended to pids); bounded by `timeout`
node() {
  local ns=$1 r=$2 log=$3
  DTRAIN_FAULT_DIVERGE=2:2 timeout -k 2 40 ip netns exec "$ns" "$bin" run s.toml --nnodes 2 \
    --node-rank "$r" --nproc 2 --master-addr "$a0" --master-port "$port" \
    --set run.name=diverge >"$log" 2>&1 &
  pids+=($!)
}

# the stranger: connects to rank 0's ledger port again and again, and
# answers each challenge with a frame claiming rank 2 whose proof comes
# from another secret
cat > stranger.py <<'P'
import hashlib, hmac, os, socket, struct, sys, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
key = hashlib.sha256(b"not the job's secret").digest()
end, sent = time.time() + secs, 0
while time.time() < end:
    try:
        s = socket.create_connection((host, port), timeout=1)
    except OSError:
        time.sleep(0.05); continue
    try:
        s.settimeout(secs)
        nonce = b""
        while len(nonce) < 16:
            d = s.recv(16 - len(nonce))
            if not d: raise OSError
            nonce += d
        body = b"\0" * 64
        hdr = struct.pack("<IIIQ", 0x58474c44, 2, len(body), time.time_ns())
        mine = os.urandom(16)
        mac = hmac.new(key, b"dtrain-ledger-hello\0" + nonce + hdr + mine + body,
                       hashlib.sha256).digest()
        s.sendall(hdr + mine + body + mac)
        sent += 1
        print(sent, flush=True)
        s.recv(64)
    except OSError:
        pass
    s.close()
P
ip netns exec "$ns1" timeout -k 1 30 /usr/bin/python3 stranger.py "$a0" $((port + 2)) 25 \
  >stranger.out 2>&1 &
spid=$!; pids+=($spid)

t0=$(date +%s.%N)
node "$ns0" 0 n0.log; p0=$!
node "$ns1" 1 n1.log; p1=$!
set +e; wait "$p0"; rc0=$?; wait "$p1"; rc1=$?; set -e
took=$(since "$t0")
kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true
out=$(cat n0.log n1.log)

want="ledger: rank 2 issued broadcast(f32, 34.2K, root 0, world group) #8 at step 2, micro-batch 0, unit 0 while ranks 0, 1, 3 issued all_reduce(f32, 34.2K, avg, world group) #8 at step 2, micro-batch 0, unit 0"
if [ "$rc0" = 1 ] && [ "$rc1" = 1 ]; then ok "both nodes exit 1 (${took} s)"
else bad "exit codes $rc0 and $rc1, expected 1 and 1" "$out"; fi
good=0
for r in 0 1 2 3; do
  n=$((r / 2))
  last=$(grep "^\[rank $r\] " "n$n.log" | tail -n 1)
  [ "$last" = "[rank $r] $want" ] && good=$((good + 1))
done
if [ "$good" = 4 ]; then ok "every rank's last line names rank 2's broadcast against the others' all_reduce at step 2"
else bad "expected every rank's last line to be '[rank R] $want'" "$out"; fi
for n in 0 1; do
  if grep -qE "^dtrain: rank [0-3] failed \(exit 1\); its last error line: " "n$n.log" &&
     grep -qF "its last error line: $want" "n$n.log"; then
    ok "node $n's launcher quotes the ledger line"
  else bad "node $n's launcher does not quote the ledger line" "$out"; fi
done
if grep -qE "^\[rank [23]\] ledger: rank 2 issued broadcast" n1.log; then
  ok "a rank of node 1 got the line from rank 0 across the link"
else bad "no rank of node 1 printed the ledger line" "$out"; fi
if grep -qE "^\[rank 0\] ledger: refused a connection from $a1:[0-9]+: it claims rank 2 but its proof of the job secret is wrong" n0.log; then
  ok "rank 0 refuses a frame whose proof of the job secret is wrong, and logs it"
else bad "rank 0 did not log the stranger's refusal" "$out"; fi
job=$(grep -ho 'dtrain: launching ranks [0-9-]* of 4 (job [^)]*)' n0.log n1.log |
      sed 's/.*(job \(.*\))/\1/' | sort -u | head -n 1)
netns_nothing_left diverge "dtrain-${job:-mn-none}*"
finish
