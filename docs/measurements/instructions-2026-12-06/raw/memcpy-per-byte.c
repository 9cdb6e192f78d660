#include <string.h>
#include <stdlib.h>
#include <stdio.h>
int main(int argc, char **argv) {
    size_t n = atoi(argv[1]); long doff = atol(argv[2]); long soff = atol(argv[3]);
    char *src = aligned_alloc(4096, 1<<22), *dst = aligned_alloc(4096, 1<<22);
    memset(src, 1, 1<<22); memset(dst, 2, 1<<22);
    for (int i = 0; i < 100; i++) memcpy(dst + doff, src + soff, n);
    printf("%d\n", dst[doff + n - 1]);
    return 0;
}
