#!/bin/bash
# Train with Open MPI's mpirun as the launcher. mpirun starts NP copies of a command and tells
# each its place in OMPI_COMM_WORLD_* variables. PyTorch reads none of them: each process hands
# them on under the names torchrun uses (RANK, WORLD_SIZE, ...), so that the torchrun-form script
# runs unchanged and init_process_group meets the others through env://, over gloo or NCCL.
# MPI only starts the processes here; it carries none of the training's data.
#
#   NP=4 bash demos/mpi/mpirun_fashion_mnist.sh --epochs 5                    (from the repository's root)
#   NP=8 HOSTFILE=hosts.txt bash demos/mpi/mpirun_fashion_mnist.sh --epochs 5  (several hosts)
#
# Arguments go to the training script. Open MPI on Debian or Ubuntu: apt-get install openmpi-bin.
#
# Several hosts: HOSTFILE lists them, one a line with its number of processes ("node01 slots=4").
# mpirun reaches the other hosts with ssh, which must work without a password, and finds this
# folder, the virtual environment and Open MPI at the same paths there (a shared file system).
# Rank 0 runs on the file's first host, so the others meet it there.
#
# PyTorch has an MPI backend of its own, init_process_group("mpi"), in which MPI carries the
# gradients too. The PyTorch from pip has none (torch.distributed.is_mpi_available() is False): it
# needs a PyTorch built from source on a machine with MPI installed. This course does not build one.

set -euo pipefail

if ! command -v mpirun >/dev/null; then
    echo "error: no mpirun here: install Open MPI (Debian, Ubuntu: apt-get install openmpi-bin)" >&2
    exit 1
fi

NP=${NP:-2}
export TRAIN_SCRIPT=${TRAIN_SCRIPT:-solutions/fashion_mnist_torchrun.py}
OPTIONS=()
if [ -n "${HOSTFILE:-}" ]; then
    OPTIONS+=(--hostfile "$HOSTFILE")
    # mpirun fills the first host's slots before the next host's: rank 0 is on the first host.
    MASTER_ADDR=${MASTER_ADDR:-$(awk '$1 !~ /^#/ && NF { print $1; exit }' "$HOSTFILE")}
else
    # mpirun counts one slot per core and refuses to start more processes than slots ("not
    # enough slots"); on one machine, let the processes share its cores instead.
    OPTIONS+=(--oversubscribe)
    MASTER_ADDR=${MASTER_ADDR:-localhost}
fi
# A port of its own for each launch: two runs on one machine would both want a fixed 29500, and the
# second would fail with "address already in use". This script's process id differs between them.
MASTER_PORT=${MASTER_PORT:-$((20000 + $$ % 20000))}
# Each process's threads: 1, as torchrun gives them, unless the caller chose.
export MASTER_ADDR MASTER_PORT OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# mpirun refuses to run as root unless told; in a container, root is the usual user.
if [ "$(id -u)" = 0 ]; then
    OPTIONS+=(--allow-run-as-root)
fi

echo "mpirun: $NP processes of $TRAIN_SCRIPT, rank 0 at $MASTER_ADDR:$MASTER_PORT"

# -x: send these variables to every process. On this machine the processes inherit them anyway,
# but ssh starts the other hosts' processes in a fresh environment, without the virtual
# environment's python on PATH and without the rest.
# --bind-to none: by default mpirun pins each process to one core (to a socket beyond 2 processes),
# and all the threads and children of a process (PyTorch's threads, the data loader's workers)
# would share that core. Leave the placement to the operating system, as torchrun does.
# The single quotes matter: each process expands its own OMPI_COMM_WORLD_RANK. In double quotes
# this script would expand them itself, before mpirun starts anything, and it has none.
# When one process fails, mpirun stops the others by itself (they would wait for it in the next
# collective): unlike srun, it needs no option for that.
# exec: this script *becomes* mpirun, so that a signal sent to it (Ctrl-C, kill) reaches mpirun,
# which then stops every process (it sends them SIGTERM).
exec mpirun -np "$NP" "${OPTIONS[@]}" --bind-to none \
    -x PATH -x TRAIN_SCRIPT -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS \
    bash -c '
    export RANK=$OMPI_COMM_WORLD_RANK LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK
    export WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE
    exec python "$TRAIN_SCRIPT" "$@"
' bash "$@"    # "bash" becomes $0 inside; this script's arguments become "$@"
