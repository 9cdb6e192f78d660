#!/bin/busybox sh
# guest-init.sh - /init of the test guest (PID 1).
# Loads the modules in /modules.list, mounts the host root (9p, read-only) and the
# run's writable results share at the same path it has on the host, chroots into the
# host root, runs $results/cmd.sh with bash, stores its exit code, powers off.
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m args; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" $args 2>/dev/null || echo "guest-init: insmod $m failed" > /dev/console
done < /modules.list
die() { echo "guest-init: FATAL: $*" > /dev/console; sync; poweroff -f; sleep 5; echo o > /proc/sysrq-trigger; }
R="$testbed_results"
[ -n "$R" ] || die "testbed_results not set on the kernel command line"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot || die "cannot mount hostroot"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results "/newroot$R" || die "cannot mount the results share at $R"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
# Writable scratch (the host root is read-only): /run only. The host's /tmp stays visible,
# read-only, because a checkout (CI's clone) may live there; TMPDIR points into /run.
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/run/tmp /newroot/run/home
ip link set lo up
T1=$(cut -d' ' -f1 /proc/uptime)
chroot /newroot /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/run/home TMPDIR=/run/tmp TERM=dumb LANG=C.UTF-8 TESTBED_RESULTS="$R" \
    /bin/bash -c 'cd "$TESTBED_RESULTS" && ulimit -l unlimited && ulimit -c 0 && exec /bin/bash ./cmd.sh' \
    > "/newroot$R/out.log" 2>&1 < /dev/null
RC=$?
T2=$(cut -d' ' -f1 /proc/uptime)
echo "cmd_start_uptime=$T1 cmd_end_uptime=$T2" > "/newroot$R/guest-times"
echo "$RC" > "/newroot$R/rc"
sync
umount "/newroot$R" 2>/dev/null
poweroff -f
sleep 5
echo o > /proc/sysrq-trigger
