/* Host memory read bandwidth by thread count, for the decode plan's host-RAM term (lab/bench/measure_decode.py
 * --jobs runs it beside llama-bench): each thread sums its share of a buffer far larger than the caches,
 * three passes, the best one kept. Beside it, the host's compute with as many threads: each thread runs twelve
 * 8-lane multiply-add chains in registers (no memory traffic; enough chains to fill the FMA units, so a neighbour on
 * the same core or a hypervisor taking the core slows it), three passes, the best kept, in Gop/s.
 * A shared host's two readings move apart: one tells the reads of weights, the other the CPU's own work (its
 * attention, its time per block), and make bench restates each term at its own (lab/bench/decode_error.py).
 * Build: cc -O2 -march=native -fopenmp host_bandwidth.c -o host_bandwidth
 * Usage: host_bandwidth GIB THREADS...   prints one line per thread count: "threads N read_gbs X compute_gops Y" */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Twelve chains of eight lanes: two FMA units of four cycles' latency keep eight busy, so the units are full and a
 * neighbour on the same core slows it (chains in an array stay in memory at -O2 and wait on their own stores). */
typedef float lanes __attribute__((vector_size(32)));
#define STEPS 100000000L  /* 19.2 Gop a thread: 0.16 s a pass on the CI machine's EPYC (117 Gop/s a thread) */

static volatile float seed = 0.999f, step = 1e-7f, sink;

/* Gop/s (a multiply-add counts two) of this many threads, each running the twelve chains STEPS steps; the threads
 * counted as they ran (the runtime may give fewer than asked). */
static double compute_gops(int threads) {
    int ran = 0;
    double total = 0, t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : ran, total)
    {
        lanes m = {0}, c = {0}, a[12];
        m += seed;
        c += step;
        for (int j = 0; j < 12; j++) a[j] = c * (float)j;
        lanes a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7], a8 = a[8],
              a9 = a[9], a10 = a[10], a11 = a[11];
        for (long i = 0; i < STEPS; i++) {
            a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c; a4 = a4 * m + c; a5 = a5 * m + c;
            a6 = a6 * m + c; a7 = a7 * m + c; a8 = a8 * m + c; a9 = a9 * m + c; a10 = a10 * m + c; a11 = a11 * m + c;
        }
        lanes sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
        for (int k = 0; k < 8; k++) total += sum[k];
        ran += 1;
    }
    double seconds = omp_get_wtime() - t0;
    sink = (float)total;  /* the chains' result is used: none is optimised away */
    return 2.0 * 12 * 8 * STEPS * ran / seconds / 1e9;
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
