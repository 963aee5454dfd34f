// Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014), Figure 1, verbatim,
// with a driver that reads "key buckets" lines and prints one bucket per line.
#include <cstdint>
#include <cstdio>

int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets) {
  int64_t b = -1, j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = (b + 1) * (double(1LL << 31) / double((key >> 33) + 1));
  }
  return b;
}

int main() {
  unsigned long long key;
  int buckets;
  while (scanf("%llu %d", &key, &buckets) == 2) printf("%d\n", JumpConsistentHash(key, buckets));
  return 0;
}
