/* Open MPI's MPI_Allreduce (in place, float32, MPI_SUM), timed as
 * tensorwire bench collective times its own: a barrier, then one call, the
 * median of the timed calls on rank 0. Built by the benchmark with mpicc
 * and started with mpirun when both are on PATH (openmpi.go); argv: the
 * sizes in bytes. One JSON line per size on rank 0's stdout. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	int r, n;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &r);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	for (int s = 1; s < argc; s++) {
		long bytes = atol(argv[s]);
		long elems = bytes / 4 / n * n;
		if (elems < n)
			elems = n;
		float *x = malloc(elems * 4);
		for (long i = 0; i < elems; i++)
			x[i] = (float)((i * 2654435761u + r) % 1000) / 1000.0f;
		long it = (256L << 20) / bytes;
		int iters = it < 5 ? 5 : it > 500 ? 500 : (int)it;
		int warm = (iters < 20 ? iters : 20) / 4;
		for (int i = 0; i < warm; i++)
			MPI_Allreduce(MPI_IN_PLACE, x, elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		double *t = malloc(iters * sizeof(double));
		for (int i = 0; i < iters; i++) {
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			MPI_Allreduce(MPI_IN_PLACE, x, elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			t[i] = MPI_Wtime() - t0;
		}
		qsort(t, iters, sizeof(double), cmp);
		if (r == 0) {
			/* The Go ranks' p50 (report.Percentile): the nearest rank,
			 * ceil(iters/2), the lower middle value of an even count. */
			double p50 = t[(iters + 1) / 2 - 1], alg = elems * 4 / p50 / 1e9;
			printf("{\"op\":\"allreduce\",\"ranks\":%d,\"bytes\":%ld,\"transport\":\"mpi\",\"system\":\"openmpi\","
			       "\"p50_us\":%.3f,\"algbw_GBps\":%.6f,\"busbw_GBps\":%.6f}\n",
			       n, elems * 4, p50 * 1e6, alg, alg * 2 * (n - 1) / n);
			fflush(stdout);
		}
		free(x);
		free(t);
	}
	MPI_Finalize();
	return 0;
}
