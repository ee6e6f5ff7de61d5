/* Host memory read bandwidth by thread count, for the decode plan's host-RAM term (lab/bench/measure_decode.py
 * --jobs runs it beside llama-bench): each thread sums its share of a buffer far larger than the caches,
 * three passes, the best one kept. Beside it, the host's compute with as many threads: each thread runs 64
 * independent multiply-add chains in registers (no memory traffic; enough chains to fill the FMA units, so a
 * neighbour on the same core or a hypervisor taking the core slows it), three passes, the best kept, in Gop/s.
 * A shared host's two readings move apart: one tells the reads of weights, the other the CPU's own work (its
 * attention, its time per block), and make bench restates each term at its own (lab/bench/decode_error.py).
 * Build: cc -O2 -march=native -fopenmp host_bandwidth.c -o host_bandwidth
 * Usage: host_bandwidth GIB THREADS...   prints one line per thread count: "threads N read_gbs X compute_gops Y" */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAINS 64
#define STEPS 100000000L  /* 12.8 Gop a thread: 0.44 s a pass on the CI machine's EPYC (29 Gop/s a thread) */

static volatile float seed = 0.999f, step = 1e-7f, sink;

/* Gop/s (a multiply-add counts two) of this many threads, each running CHAINS chains STEPS steps. */
static double compute_gops(int threads) {
    double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
    {
        float acc[CHAINS], m = seed, c = step;
        for (int j = 0; j < CHAINS; j++) acc[j] = (float)j * c;
        for (long i = 0; i < STEPS; i++)
            for (int j = 0; j < CHAINS; j++) acc[j] = acc[j] * m + c;
        float total = 0;
        for (int j = 0; j < CHAINS; j++) total += acc[j];
        sink = total;  /* the chains' result is used: none is optimised away */
    }
    return 2.0 * CHAINS * STEPS * threads / (omp_get_wtime() - t0) / 1e9;
}

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
        double best = 0, best_gops = 0;
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
        for (int pass = 0; pass < 3; pass++) {
            double gops = compute_gops(threads);
            if (gops > best_gops) best_gops = gops;
        }
        printf("threads %d read_gbs %.1f compute_gops %.1f (checksum %llu)\n", threads, best, best_gops,
               (unsigned long long)(total & 0xff));
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
