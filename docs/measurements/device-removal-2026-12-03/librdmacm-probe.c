#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
static void fds(const char *when) { char cmd[256]; snprintf(cmd, sizeof cmd, "echo '== %s:'; ls -l /proc/%d/fd | grep -E 'uverbs|infiniband' ", when, getpid()); system(cmd); }
int main(int argc, char **argv) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(7000) };
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (rdma_bind_addr(id, (struct sockaddr *)&a)) { perror("bind"); return 1; }
    if (rdma_listen(id, 10)) { perror("listen"); return 1; }
    struct ibv_pd *pd = NULL; struct ibv_cq *cq = NULL; struct ibv_comp_channel *cc = NULL;
    if (argc > 2) { pd = ibv_alloc_pd(id->verbs); cc = ibv_create_comp_channel(id->verbs); cq = ibv_create_cq(id->verbs, 16, NULL, cc, 0); }
    fds("listening"); fflush(stdout);
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev)) { perror("get event"); return 1; }
    printf("event %s\n", rdma_event_str(ev->event)); fflush(stdout);
    rdma_ack_cm_event(ev);
    if (cq) { ibv_destroy_cq(cq); ibv_destroy_comp_channel(cc); ibv_dealloc_pd(pd); }
    printf("destroy id: %d\n", rdma_destroy_id(id)); fflush(stdout);
    fds("id destroyed"); fflush(stdout);
    int n; struct ibv_context **l = rdma_get_devices(&n); printf("rdma_get_devices: %d\n", n); fflush(stdout); if (l) rdma_free_devices(l);
    fds("after rdma_get_devices"); fflush(stdout);
    sleep(2);
    l = rdma_get_devices(&n); printf("rdma_get_devices again: %d\n", n); if (l) rdma_free_devices(l);
    fds("2 s later"); fflush(stdout);
    sleep(5);
    return 0;
}
