#!/bin/bash
# run-in-vm.sh [-t SECS] [-m MEM] [-s CPUS] [-v] [-r RUNDIR] [-w server:SOCK|client:SOCK -a ADDR] -- CMD...
# Runs CMD with bash in a fresh throw-away guest that has Soft-RoCE ready (rxe0 on a
# dummy interface; its address in RDMA_ADDR), chrooted into the host's root filesystem
# (read-only 9p, so host binaries run unchanged), as root, in a writable run folder
# (same path on host and guest; also TESTBED_RESULTS; -r names it). /run is tmpfs
# (TMPDIR=/run/tmp). Prints CMD's output; exits with CMD's exit code.
# By default the guest has no network device. With -w, two guests are joined by a
# wire: a virtio NIC on a QEMU stream socket (the guest started with server:SOCK
# listens, the one with client:SOCK connects), rxe0 sits on that NIC with address
# -a ADDR, and RUNDIR/monitor.sock is the QEMU monitor, where `set_link wire off`
# pulls the cable (tests/e2e/linkdown.sh).
# Own exit codes: 124 the wall-clock limit (-t, default 600 s) stopped the guest;
# 125 the guest could not be started or ended without a result.
set -uo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
TIMEOUT=600 MEM=4G CPUS=2 VERBOSE=0 RUN= WIRE= ADDR=$GUEST_RDMA_ADDR
while [ $# -gt 0 ]; do
    case "$1" in
        -t) TIMEOUT=$2; shift 2 ;;
        -m) MEM=$2; shift 2 ;;
        -s) CPUS=$2; shift 2 ;;
        -v) VERBOSE=1; shift ;;
        -r) RUN=$2; shift 2 ;;
        -w) WIRE=$2; shift 2 ;;
        -a) ADDR=$2; shift 2 ;;
        --) shift; break ;;
        -*) echo "run-in-vm: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: run-in-vm.sh [-t SECS] [-m MEM] [-s CPUS] [-v] [-r RUNDIR] [-w server:SOCK|client:SOCK -a ADDR] -- CMD..." >&2; exit 2; }
NET=(-nic none) NETDEV=
case "$WIRE" in
    "") ;;
    server:*|client:*)
        role=${WIRE%%:*} sock=${WIRE#*:}
        [ "$role" = server ] && srv=on || srv=off
        NET=(-netdev "stream,id=wire,server=$srv,addr.type=unix,addr.path=$sock"
             -device "virtio-net-pci,netdev=wire,mac=52:54:00:77:00:$([ "$role" = server ] && echo 01 || echo 02)")
        NETDEV=wire ;;
    *) echo "run-in-vm: -w takes server:SOCK or client:SOCK, not $WIRE" >&2; exit 2 ;;
esac
"$TESTBED_SCRIPTS/prepare-guest.sh" >/dev/null 2>&1 || "$TESTBED_SCRIPTS/prepare-guest.sh" || exit 125
KERNEL=$GUEST_KROOT/vmlinux
[ -f "$KERNEL" ] || KERNEL=$(ls "$GUEST_KROOT"/root/boot/vmlinuz-* | head -n1)

mkdir -p "$TESTBED/runs"
if [ -n "$RUN" ]; then mkdir -p "$RUN" && RUN=$(readlink -f "$RUN") || exit 125
else RUN=$(mktemp -d "$TESTBED/runs/run.XXXXXX"); fi
MONITOR=(-monitor none)
[ -n "$NETDEV" ] && MONITOR=(-monitor "unix:$RUN/monitor.sock,server=on,wait=off")
printf '%s\n' "$*" > "$RUN/user.sh"
cat > "$RUN/cmd.sh" <<CMD
# written by run-in-vm.sh: bring rxe up, then run the user's command
if ! bash "$TESTBED_SCRIPTS/rxe-up.sh" "$ADDR/24" $NETDEV > rxe-up.log 2>&1; then
    echo "run-in-vm: Soft-RoCE setup failed in the guest:"; cat rxe-up.log; exit 125
fi
export RDMA_ADDR=$ADDR PROJECT_ROOT="$PROJECT_ROOT" VALKEY_RDMA_TESTBED="$TESTBED"
exec bash ./user.sh
CMD

# KVM only with a hardware hypervisor module; the /dev/kvm of our build machines is
# kvm_pvm, which cannot boot a stock kernel. TCG works everywhere.
if [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; then ACCEL=(-accel kvm -cpu host); USED=kvm
else ACCEL=(-accel tcg,thread=multi -cpu max); USED=tcg; fi
T0=$(date +%s.%N)
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 \
    -nodefaults -no-user-config -display none "${MONITOR[@]}" -no-reboot \
    -M pc "${ACCEL[@]}" -m "$MEM" -smp "$CPUS" "${NET[@]}" \
    -serial "file:$RUN/console.log" \
    -kernel "$KERNEL" -initrd "$GUEST_INITRD" \
    -append "console=ttyS0 panic=-1 quiet loglevel=4 testbed_results=$RUN" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$RUN,mount_tag=results,security_model=none" \
    2> "$RUN/qemu.stderr" &
QPID=$!
trap 'kill $QPID 2>/dev/null; exit 130' INT TERM
wait $QPID; QRC=$?
WALL=$(echo "$(date +%s.%N) - $T0" | bc)
echo "accel=$USED qemu_rc=$QRC wall_s=$WALL" > "$RUN/host-times"
[ "$VERBOSE" = 1 ] && sed 's/^/console: /' "$RUN/console.log" >&2
[ -f "$RUN/out.log" ] && cat "$RUN/out.log"
if [ -f "$RUN/rc" ]; then
    echo "run-in-vm: run folder $RUN, $USED, ${WALL%.*} s" >&2
    exit "$(cat "$RUN/rc")"
elif [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    echo "run-in-vm: TIMEOUT: the guest ran past the ${TIMEOUT}s limit and was stopped (run folder $RUN)" >&2
    exit 124
else
    echo "run-in-vm: the guest ended without a result (qemu rc=$QRC, run folder $RUN); console tail:" >&2
    grep -v '^$' "$RUN/qemu.stderr" >&2; tail -n 20 "$RUN/console.log" >&2
    exit 125
fi
