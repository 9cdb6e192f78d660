# perf report --sort dso,sym lines -> share of samples by part of the server
{
  pct = $1; sub("%", "", pct); dso = $2; sym = $NF
  if (dso == "[kernel.kallsyms]") {
    if (sym == "read_hpet" || sym ~ /^ktime_get/) part = "kernel: clock source (Valkey's time calls)"
    else if (sym ~ /^rxe_|crc32|icrc|skb|^ip_|^__ip|^udp|^__udp|^dev_|^__dev|netif|^net_|tasklet/) part = "kernel: rxe transport and its network path"
    else part = "kernel: other (syscall entry, scheduling, memory)"
  }
  else if (dso == "valkey-server") part = "valkey-server"
  else if (dso == "valkey-rdma.so" || dso ~ /^librdma[-.]/) part = "the module"
  else if (dso ~ /librxe|libibverbs|librdmacm/) part = "rdma-core (user space)"
  else if (dso ~ /libc/) part = "libc"
  else part = "other"
  s[part] += pct
}
END { for (p in s) printf "  %-52s %6.2f%%\n", p, s[p] }
