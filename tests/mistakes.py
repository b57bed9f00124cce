"""Typical learner mistakes: each the finished solution with one thing done wrong.

Each names the step whose check must fail and words its verdict must contain.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    name: str
    step: str
    edits: tuple[tuple[str, str], ...]
    expect: str
    # earlier steps that fail too, for real, with these words (most mistakes leave them passing)
    also_fails: tuple[tuple[str, str], ...] = ()

    def apply(self, text: str) -> str:
        for old, new in self.edits:
            assert text.count(old) == 1, f"{self.name}: the solution no longer contains {old!r} once"
            text = text.replace(old, new)
        return text


MISTAKES = [
    Mistake("no_master_port", "2", (('    os.environ["MASTER_PORT"] = str(args.master_port)\n', ""),),
            "MASTER_PORT is None"),
    Mistake("world_size_missing", "2", (("    args.world_size = args.num_nodes * args.num_gpus\n",
                                         "    args.world_size = args.num_gpus\n"),), "no world size of 6"),
    Mistake("rank_is_local_rank", "4", (("    rank = args.node_id * args.num_gpus + local_rank\n",
                                         "    rank = local_rank\n"),), "joined as rank"),
    Mistake("nccl_on_cpu", "4", (('    backend = "nccl" if torch.cuda.is_available() else "gloo"\n',
                                  '    backend = "nccl"\n'),), "backend 'nccl' on the CPU"),
    Mistake("download_on_every_rank", "5", (("    if local_rank == 0:\n        train_set, val_set = load_datasets("
                                             "args.data_dir, download=True)\n",
                                             "    train_set, val_set = load_datasets(args.data_dir, download=True)\n"),
                                            ("    if local_rank != 0:\n        train_set, val_set = load_datasets("
                                             "args.data_dir, download=False)\n", "")),
            "processes of node 0 asked to download"),
    Mistake("no_barrier_after_download", "5", (("    dist.barrier()  # everyone waits here until the files are on "
                                                 "disk\n", ""),), "read the data set before it was there"),
    Mistake("download_barrier_inside_if", "5", (("        train_set, val_set = load_datasets(args.data_dir, "
                                                  "download=True)\n    dist.barrier()",
                                                  "        train_set, val_set = load_datasets(args.data_dir, "
                                                  "download=True)\n        dist.barrier()"),),
            "read the data set before it was there"),
    Mistake("samplers_not_given_to_loaders", "6", (("sampler=train_sampler)", "shuffle=True)"),
                                                   ("sampler=val_sampler)", "shuffle=False)")),
            "not a DistributedSampler"),
    Mistake("sampler_rank_is_local_rank", "6", (("train_set, num_replicas=args.world_size, rank=rank, shuffle=True)",
                                                 "train_set, num_replicas=args.world_size, rank=local_rank, "
                                                 "shuffle=True)"),), "rank=0"),
    Mistake("no_set_epoch", "6.5", (("        train_sampler.set_epoch(epoch)\n", ""),), "the same order"),
    Mistake("set_epoch_constant", "6.5", (("        train_sampler.set_epoch(epoch)\n", "        train_sampler.set_epoch(0)\n"),),
            "the same order"),
    Mistake("set_epoch_differs_by_rank", "6.5", (("        train_sampler.set_epoch(epoch)\n",
                                                  "        train_sampler.set_epoch(epoch + rank)\n"),),
            "different epochs"),
    Mistake("wrapped_before_moved", "7", (("    model = WideResNet(args.widen_factor).to(device)\n",
                                           "    model = WideResNet(args.widen_factor)\n"),
                                          ("        model, device_ids=[local_rank] if torch.cuda.is_available() "
                                           "else None)\n",
                                           "        model, device_ids=[local_rank] if torch.cuda.is_available() "
                                           "else None).to(device)\n")), "moved the model after wrapping"),
    Mistake("no_ddp", "7", (("    model = nn.parallel.DistributedDataParallel(\n        model, device_ids=[local_rank] "
                             "if torch.cuda.is_available() else None)\n", ""),), "DistributedDataParallel"),
    Mistake("no_epoch_barrier", "8", (("        dist.barrier()  # the epoch is over when the slowest process is "
                                       "done\n", ""),), "not a barrier"),
    Mistake("epoch_barrier_on_rank_0_only", "8", (("        dist.barrier()  # the epoch is over when the slowest "
                                                   "process is done\n",
                                                   "        if rank == 0:\n            dist.barrier()\n"),),
            "not a barrier"),
    Mistake("images_per_sec_not_reduced", "8", (("        dist.reduce(rate, dst=0, op=dist.ReduceOp.SUM)\n", ""),),
            "images/sec"),
    Mistake("metrics_summed_not_divided", "9", (("        val_loss, val_accuracy = (totals[:2] / totals[2]).tolist()\n",
                                                 "        val_loss, val_accuracy = (totals[:2] / totals[2] * "
                                                 "args.world_size).tolist()\n"),), "over all ranks the validation loss is"),
    Mistake("metrics_not_reduced", "9", (("        dist.all_reduce(totals, op=dist.ReduceOp.SUM)  # every rank gets "
                                          "the same totals\n", ""),), "over all ranks the validation loss is"),
    Mistake("every_rank_prints", "9", (("        if rank == 0:\n            print(f\"epoch",
                                        "        if True:\n            print(f\"epoch"),), "printed by ranks"),
    Mistake("early_stop_on_rank_0_only", "9", (("        if done:  # after Step 9", "        if done and rank == 0:  #"),),
            "different numbers of epochs"),
    Mistake("spawn_wrong_nprocs", "10", (("        mp.spawn(worker, args=(args,), nprocs=args.num_gpus)\n",
                                          "        mp.spawn(worker, args=(args,), nprocs=1)\n"),), "nprocs=1"),
    Mistake("spawn_without_main_guard", "10", (('if __name__ == "__main__":\n    try:\n        main()\n    except '
                                                'KeyboardInterrupt:\n        sys.exit("interrupted")\n',
                                                'main()\n'),), "re-import",
            # every process re-runs main() when it imports the script, so nothing trains, as for real
            also_fails=(("3", "put the launch under"),)),
]

# Mistakes that only a run on GPUs can show (the checker's GPU mode, 2 GPUs or more): `make gpu-check` runs them.
GPU_MISTAKES = [
    Mistake("device_not_pinned", "4", (("    rank = args.node_id * args.num_gpus + local_rank\n"
                                        "    if torch.cuda.is_available():\n        torch.cuda.set_device(local_rank)\n",
                                        "    rank = args.node_id * args.num_gpus + local_rank\n"),), "set_device"),
]
