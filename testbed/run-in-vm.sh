#!/bin/bash
# run-in-vm.sh [-t SECS] [-m MEM] [-s CPUS] [-v] -- CMD...
# Runs CMD with bash in a fresh throw-away guest that has Soft-RoCE ready (rxe0 on a
# dummy interface; its address in RDMA_ADDR), chrooted into the host's root filesystem
# (read-only 9p, so host binaries run unchanged), as root, in a writable run folder
# (same path on host and guest; also TESTBED_RESULTS). /run is tmpfs (TMPDIR=/run/tmp).
# The guest has no network device. Prints CMD's output; exits with CMD's exit code.
# Own exit codes: 124 the wall-clock limit (-t, default 600 s) stopped the guest;
# 125 the guest could not be started or ended without a result.
set -uo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
TIMEOUT=600 MEM=4G CPUS=2 VERBOSE=0
while [ $# -gt 0 ]; do
    case "$1" in
        -t) TIMEOUT=$2; shift 2 ;;
        -m) MEM=$2; shift 2 ;;
        -s) CPUS=$2; shift 2 ;;
        -v) VERBOSE=1; shift ;;
        --) shift; break ;;
        -*) echo "run-in-vm: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: run-in-vm.sh [-t SECS] [-m MEM] [-s CPUS] [-v] -- CMD..." >&2; exit 2; }
"$TESTBED_SCRIPTS/prepare-guest.sh" >/dev/null 2>&1 || "$TESTBED_SCRIPTS/prepare-guest.sh" || exit 125
KERNEL=$GUEST_KROOT/vmlinux
[ -f "$KERNEL" ] || KERNEL=$(ls "$GUEST_KROOT"/root/boot/vmlinuz-* | head -n1)

mkdir -p "$TESTBED/runs"
RUN=$(mktemp -d "$TESTBED/runs/run.XXXXXX")
printf '%s\n' "$*" > "$RUN/user.sh"
cat > "$RUN/cmd.sh" <<CMD
# written by run-in-vm.sh: bring rxe up, then run the user's command
if ! bash "$TESTBED_SCRIPTS/rxe-up.sh" "$GUEST_RDMA_ADDR/24" > rxe-up.log 2>&1; then
    echo "run-in-vm: Soft-RoCE setup failed in the guest:"; cat rxe-up.log; exit 125
fi
export RDMA_ADDR=$GUEST_RDMA_ADDR PROJECT_ROOT="$PROJECT_ROOT" VALKEY_RDMA_TESTBED="$TESTBED"
exec bash ./user.sh
CMD

# KVM only with a hardware hypervisor module; the /dev/kvm of our build machines is
# kvm_pvm, which cannot boot a stock kernel. TCG works everywhere.
if [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; then ACCEL=(-accel kvm -cpu host); USED=kvm
else ACCEL=(-accel tcg,thread=multi -cpu max); USED=tcg; fi
T0=$(date +%s.%N)
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 \
    -nodefaults -no-user-config -display none -monitor none -no-reboot \
    -M pc "${ACCEL[@]}" -m "$MEM" -smp "$CPUS" -nic none \
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
