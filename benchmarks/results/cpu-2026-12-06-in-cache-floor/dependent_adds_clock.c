// A dependent chain of 10^9 integer adds (one per cycle): an estimate of the core clock. It prints
// additions per second (cycles per second); the "GHz" label is off by 10^9.
#include <stdio.h>
#include <time.h>
int main() {
  struct timespec a, b;
  long x = 0;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < 1000000000L; i++) {
    __asm__ volatile("add $1, %0" : "+r"(x));
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
  printf("%.2f GHz (approx, 1 add/cycle loop)\n", 1e9 / s);
}
