/* An all-to-all of small messages and a barrier under SMPI: the key exchange of a Split-C
 * small-message sort (every rank sends one message to every other rank), as stacklib's
 * stacklib.bench.alltoall runs it on its own simulated cluster.
 *
 * Usage: alltoall SIZE ROUNDS.  Per round, rank r sends SIZE bytes to r+1, r+2, ... (mod P),
 * receives P-1 messages from any rank, then passes a dissemination barrier (in step k it
 * sends 4 bytes to r+2^k and receives from r-2^k).  Rank 0 prints "P SECONDS": the simulated
 * time at which the last rank left the last barrier.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, p, bytes, rounds, round, step, k, tag;
    char *out, *in, token[4] = {0};
    double end, latest;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc != 3) {
        if (rank == 0)
            fprintf(stderr, "usage: %s SIZE ROUNDS\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    bytes = atoi(argv[1]);
    rounds = atoi(argv[2]);
    out = calloc(bytes > 0 ? bytes : 1, 1);
    in = calloc(bytes > 0 ? bytes : 1, 1);
    for (round = 0; round < rounds; round++) {
        for (step = 1; step < p; step++)
            MPI_Send(out, bytes, MPI_BYTE, (rank + step) % p, 0, MPI_COMM_WORLD);
        for (step = 1; step < p; step++)
            MPI_Recv(in, bytes, MPI_BYTE, MPI_ANY_SOURCE, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (k = 1, tag = 1; k < p; k *= 2, tag++) {
            MPI_Send(token, 4, MPI_BYTE, (rank + k) % p, tag, MPI_COMM_WORLD);
            MPI_Recv(token, 4, MPI_BYTE, (rank - k + p) % p, tag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        }
    }
    end = MPI_Wtime();
    MPI_Reduce(&end, &latest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%d %.12g\n", p, latest);
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}
