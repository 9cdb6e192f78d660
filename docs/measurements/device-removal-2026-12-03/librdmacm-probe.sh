cd /tmp/probe
for v in "" objs; do
  ./p $RDMA_ADDR $v > $TESTBED_RESULTS/p$v.out 2>&1 &
  P=$!
  sleep 1
  (timeout 30 rdma link delete rxe0; echo "delete rc=$?") &
  D=$!
  wait $P; cat $TESTBED_RESULTS/p$v.out
  wait $D
  rdma link add rxe0 type rxe netdev dummy0; sleep 2; rdma link show
done
