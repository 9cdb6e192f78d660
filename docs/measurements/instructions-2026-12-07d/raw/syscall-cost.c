// the cost of the cheapest kernel entries of a completion event's kind on this host:
// getppid() (an empty system call) and read() of an eventfd with a count pending
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){
  const int N=2000000; int fd=eventfd(0,EFD_NONBLOCK); uint64_t v=1;
  for(int round=0;round<5;round++){
    double t0=now(); for(int i=0;i<N;i++) getppid(); double t1=now();
    for(int i=0;i<N;i++){ write(fd,&v,8); read(fd,&v,8); v=1; } double t2=now();
    printf("getppid %.0f ns, eventfd write+read %.0f ns\n",(t1-t0)/N*1e9,(t2-t1)/N*1e9);
  }
}
