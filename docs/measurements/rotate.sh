# rotate.sh: sourced by the measurement scripts that run the C module and builds of ours on the
# same server binary in turn (write-path-2026-12-02/cpu.sh, churn-2026-12-02/ab.sh).
# modules BUILD...: the C module (left out when NO_C is set) and /tmp/ab/librdma-BUILD.so for
# each BUILD, into MODULES.
modules() {
  MODULES=()
  [ -n "${NO_C:-}" ] || MODULES=("$VALKEY_912/src/valkey-rdma.so")
  local b
  for b in "$@"; do MODULES+=("/tmp/ab/librdma-$b.so"); done
}
# rotation ROUND: MODULES in the order of round ROUND (1-based); each round starts one later,
# so that no module always runs first.
rotation() {
  local n=${#MODULES[@]} k j
  k=$(( ($1 - 1) % n ))
  for j in $(seq 0 $((n - 1))); do echo "${MODULES[$(( (k + j) % n ))]}"; done
}
