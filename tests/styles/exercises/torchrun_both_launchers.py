# replaces: main
def main():
    """Keeps the lab's launcher for runs started by hand, and uses torchrun's environment when
    torchrun started the process: both work, and under torchrun mp.spawn is never called."""
    parser = argparse.ArgumentParser(description="Train a WideResNet on Fashion-MNIST.")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--base-lr", type=float, default=0.01)
    parser.add_argument("--target-accuracy", type=float, default=0.85)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--widen-factor", type=int, default=10)
    parser.add_argument("--num-gpus", type=int, default=1, help="processes when started without torchrun")
    parser.add_argument("--master-port", type=int, default=29500, help="rank 0's port without torchrun")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--sync-bn", action="store_true")
    args = parser.parse_args()
    if "RANK" in os.environ:  # torchrun (or SLURM's mapping) started this process
        worker(int(os.environ["LOCAL_RANK"]), args)
        return
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(args.master_port),
                      WORLD_SIZE=str(args.num_gpus), LOCAL_WORLD_SIZE=str(args.num_gpus))
    import torch.multiprocessing as mp
    mp.spawn(by_hand, args=(args,), nprocs=args.num_gpus)


def by_hand(local_rank, args):
    """A process started by mp.spawn: it sets what torchrun would have set."""
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank))
    worker(local_rank, args)
