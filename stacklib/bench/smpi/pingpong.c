/* Ping-pong between ranks 0 and 1 under SMPI: the RTT/2 of stacklib's LogP method.
 *
 * Usage: pingpong ITERATIONS SIZE...  Rank 0 prints one line per size, "SIZE RTT_HALF", the
 * mean half round trip in (simulated) seconds over ITERATIONS round trips after one warm-up.
 * Ranks above 1 only take part in MPI_Init and MPI_Finalize.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size_count, iterations, i, s, largest = 0;
    char *buffer;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: %s ITERATIONS SIZE...\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    iterations = atoi(argv[1]);
    size_count = argc - 2;
    for (s = 0; s < size_count; s++)
        if (atoi(argv[2 + s]) > largest)
            largest = atoi(argv[2 + s]);
    buffer = calloc(largest > 0 ? largest : 1, 1);
    for (s = 0; s < size_count && rank < 2; s++) {
        int bytes = atoi(argv[2 + s]);
        double start = 0.0;
        for (i = -1; i < iterations; i++) { /* round -1 is the warm-up */
            if (i == 0)
                start = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(buffer, bytes, MPI_BYTE, 1, s, MPI_COMM_WORLD);
                MPI_Recv(buffer, bytes, MPI_BYTE, 1, s, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buffer, bytes, MPI_BYTE, 0, s, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buffer, bytes, MPI_BYTE, 0, s, MPI_COMM_WORLD);
            }
        }
        if (rank == 0)
            printf("%d %.12g\n", bytes, (MPI_Wtime() - start) / (2.0 * iterations));
    }
    free(buffer);
    MPI_Finalize();
    return 0;
}
