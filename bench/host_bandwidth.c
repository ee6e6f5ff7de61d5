/* Host memory read bandwidth by thread count, for the decode plan's host-RAM term (lab/bench/measure_decode.py
 * --jobs runs it beside llama-bench): each thread sums its share of a buffer far larger than the caches,
 * three passes, the best one kept. Build: cc -O2 -march=native -fopenmp host_bandwidth.c -o host_bandwidth
 * Usage: host_bandwidth GIB THREADS...   prints one line per thread count: "threads N read_gbs X" */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s GIB THREADS...\n", argv[0]); return 2; }
    size_t n = (size_t)(atof(argv[1]) * (1 << 30)) / sizeof(uint64_t);
    uint64_t *a = malloc(n * sizeof(uint64_t));
    if (!a) { perror("malloc"); return 1; }
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) a[i] = i;  /* first touch spread over the threads */
    double figures[64];
    int counts[64], m = 0;
    for (int k = 2; k < argc && m < 64; k++) {
        int threads = atoi(argv[k]);
        double best = 0;
        uint64_t total = 0;
        for (int pass = 0; pass < 3; pass++) {
            double t0 = omp_get_wtime();
            uint64_t sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum) schedule(static)
            for (size_t i = 0; i < n; i++) sum += a[i];
            double gbs = n * sizeof(uint64_t) / (omp_get_wtime() - t0) / 1e9;
            if (gbs > best) best = gbs;
            total += sum;
        }
        printf("threads %d read_gbs %.1f (checksum %llu)\n", threads, best, (unsigned long long)(total & 0xff));
        fflush(stdout);
        counts[m] = threads;
        figures[m++] = best;
    }
    printf("for the stack file (node_pools.<pool>): memory_bandwidth_by_threads: {");
    for (int i = 0; i < m; i++) printf("%s%d: %.0f", i ? ", " : "", counts[i], figures[i]);
    printf("}\n");
    free(a);
    return 0;
}
