"""Typical learner mistakes: each the finished solution with one thing done wrong.

Each names the step whose check must fail and words its verdict must contain. The same
mistakes are also made in a second style, the original vendor lab's (tests/styles/original_lab.py:
module-level argparse and WORLD_SIZE, its own names and epoch line): ORIGINAL_LAB_MISTAKES.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


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
    # a worker that crashes on its first line has started in every process, but done nothing
    Mistake("worker_crashes_on_its_first_line", "3", (("    rank = args.node_id * args.num_gpus + local_rank\n",
                                                       "    local_rank = args.local_rank\n"
                                                       "    rank = args.node_id * args.num_gpus + local_rank\n"),),
            "crashed before it did anything"),
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


# The catalogue's mistakes made in the original lab's style: the same step and words, its own edits.
_SAMPLERS = ("    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=False,\n"
             "                                               sampler=train_sampler)\n"
             "    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.batch_size, shuffle=False,\n"
             "                                              sampler=test_sampler)\n")
_EPOCH_BARRIER = "        dist.barrier()\n        epoch_time = time.time() - t0\n"
_SPAWN = "mp.spawn(worker, nprocs=args.num_gpus, args=(args,))"
ORIGINAL_LAB_EDITS: dict[str, tuple[tuple[str, str], ...]] = {
    "no_master_port": (("os.environ['MASTER_PORT'] = str(args.master_port)\n", ""),),
    "world_size_missing": (("WORLD_SIZE = args.num_gpus * args.num_nodes\n", "WORLD_SIZE = args.num_gpus\n"),),
    "worker_crashes_on_its_first_line": (("    global_rank = args.node_id * args.num_gpus + local_rank\n",
                                          "    local_rank = args.local_rank\n"
                                          "    global_rank = args.node_id * args.num_gpus + local_rank\n"),),
    "rank_is_local_rank": (("    global_rank = args.node_id * args.num_gpus + local_rank\n",
                            "    global_rank = local_rank\n"),),
    "nccl_on_cpu": (("        backend = 'gloo'\n", "        backend = 'nccl'\n"),),
    "download_on_every_rank": (("    download = True if local_rank == 0 else False\n", "    download = True\n"),),
    "no_barrier_after_download": (("    dist.barrier()\n    if local_rank != 0:\n", "    if local_rank != 0:\n"),),
    "download_barrier_inside_if": (("transform=transform)\n    dist.barrier()\n    if local_rank != 0:\n",
                                    "transform=transform)\n        dist.barrier()\n    if local_rank != 0:\n"),),
    "samplers_not_given_to_loaders": ((_SAMPLERS, _SAMPLERS.replace(
        "shuffle=False,\n                                               sampler=train_sampler)", "shuffle=True)").replace(
        ",\n                                              sampler=test_sampler)", ")")),),
    "sampler_rank_is_local_rank": (("DistributedSampler(train_set, num_replicas=WORLD_SIZE, rank=global_rank)",
                                    "DistributedSampler(train_set, num_replicas=WORLD_SIZE, rank=local_rank)"),),
    "no_set_epoch": (("        train_sampler.set_epoch(epoch)\n", ""),),
    "set_epoch_constant": (("        train_sampler.set_epoch(epoch)\n", "        train_sampler.set_epoch(0)\n"),),
    "set_epoch_differs_by_rank": (("        train_sampler.set_epoch(epoch)\n",
                                   "        train_sampler.set_epoch(epoch + global_rank)\n"),),
    "wrapped_before_moved": (("widen_factor=args.widen_factor).to(device)\n", "widen_factor=args.widen_factor)\n"),
                             ("        model = DDP(model)\n", "        model = DDP(model).to(device)\n")),
    "no_ddp": (("    if torch.cuda.is_available():\n        model = DDP(model, device_ids=[local_rank])\n"
                "    else:\n        model = DDP(model)\n", ""),),
    "no_epoch_barrier": ((_EPOCH_BARRIER, "        epoch_time = time.time() - t0\n"),),
    "epoch_barrier_on_rank_0_only": ((_EPOCH_BARRIER, "        if global_rank == 0:\n            dist.barrier()\n"
                                      "        epoch_time = time.time() - t0\n"),),
    "images_per_sec_not_reduced": (("        dist.reduce(images_per_sec, 0, op=dist.ReduceOp.SUM)\n", ""),),
    "metrics_summed_not_divided": (("(v_loss_total / v_labels).item()", "(v_loss_total / v_labels * WORLD_SIZE).item()"),
                                   ("(v_correct / v_labels).item()", "(v_correct / v_labels * WORLD_SIZE).item()")),
    "metrics_not_reduced": (("        dist.all_reduce(v_loss_total, op=dist.ReduceOp.SUM)\n"
                             "        dist.all_reduce(v_correct, op=dist.ReduceOp.SUM)\n"
                             "        dist.all_reduce(v_labels, op=dist.ReduceOp.SUM)\n", ""),),
    "every_rank_prints": (("        if global_rank == 0:\n            print(\"Epoch", "        if True:\n            print(\"Epoch"),),
    "early_stop_on_rank_0_only": (("        if len(val_accuracy) >= args.patience and all(",
                                   "        if global_rank == 0 and len(val_accuracy) >= args.patience and all("),),
    "spawn_wrong_nprocs": ((_SPAWN, _SPAWN.replace("nprocs=args.num_gpus", "nprocs=1")),),
    "spawn_without_main_guard": ((f"if __name__ == '__main__':\n    {_SPAWN}", _SPAWN),),
}
ORIGINAL_LAB_MISTAKES = [replace(m, edits=ORIGINAL_LAB_EDITS[m.name]) for m in MISTAKES]


# The exercises' typical mistakes, each made in the exercise's solution (solutions/<file>.py, the
# checkpoint autograde/grading/registry.py names). Recorded real runs, replayed in tests/core/test_checks_recorded.py.
PI_SHARE = ("    start = rank * intervals // world_size\n    stop = (rank + 1) * intervals // world_size\n")
RING_EXCHANGE = ("    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, send_chunk.contiguous(), right),\n"
                 "                                       dist.P2POp(dist.irecv, recv_chunk, left)])\n"
                 "    for request in requests:\n        request.wait()\n")
RING_CHUNKS = "    chunks = tensor.view(-1).tensor_split(world_size)  # views: writing a chunk writes the tensor\n"
# the whole tensor passed round the ring and added up: right, but N-1 messages of the whole tensor
RING_WHOLE = """    passing, incoming, total = tensor.clone(), torch.empty_like(tensor), tensor.clone()
    for s in range(world_size - 1):
        exchange(passing, incoming, right, left)
        passing = incoming.clone()
        total = total + incoming if op == "sum" else torch.maximum(total, incoming)
    tensor.copy_(total)
    return tensor
"""
SAMPLER_SHUFFLE = ("            generator = torch.Generator().manual_seed(self.seed + self.epoch)\n"
                   "            order = torch.randperm(self.size, generator=generator).tolist()\n")
OVERLAP_WAIT = "            handle.wait()\n            gradient /= world_size\n"
ZERO_MINE = "        mine = [p for i, p in enumerate(self.params) if self.owner[i] == rank]\n"
ZERO_MEMORY_RETURN = '    return [{"parameters": whole, "gradients": whole, "optimizer_state": s} for s in state]\n'
ZERO_SEND = "        for i, p in enumerate(self.params):\n            dist.broadcast(p.data, src=self.owner[i])\n"
SAVE_GUARD = "    if dist.get_rank() == 0:\n        checkpoint = {\n"
SAVE_ATOMIC = "        torch.save(checkpoint, temporary)\n        os.replace(temporary, path)\n"
SAVE_BARRIER = "    dist.barrier()  # nobody goes on (or reads the file) before it is complete\n"
EXERCISE_MISTAKES = [
    Mistake("pi_remainder_dropped", "pi", ((PI_SHARE, "    share = intervals // world_size\n"
                                                      "    start, stop = rank * share, (rank + 1) * share\n"),),
            "away from pi"),
    Mistake("pi_no_all_reduce", "pi", (("    dist.all_reduce(part)\n", ""),), "printed no number near pi"),
    Mistake("pi_all_reduce_max", "pi", (("    dist.all_reduce(part)\n",
                                         "    dist.all_reduce(part, op=dist.ReduceOp.MAX)\n"),),
            "printed no number near pi"),
    Mistake("pi_everything_on_every_rank", "pi", ((PI_SHARE, "    start, stop = 0, intervals\n"),
                                                  ("    part = f((i + 0.5) / intervals).sum() / intervals\n",
                                                   "    part = f((i + 0.5) / intervals).sum() / intervals / world_size\n")),
            "of the work one process does alone"),
    Mistake("pi_too_few_decimals", "pi", (('print(f"pi = {pi:.15f}', 'print(f"pi = {pi:.4f}'),), "decimals"),
    # every rank sends first with a blocking call: each waits for a neighbour that is sending too
    Mistake("ring_blocking_send_first", "ring", ((RING_EXCHANGE, "    dist.send(send_chunk.contiguous(), dst=right)\n"
                                                                 "    dist.recv(recv_chunk, src=left)\n"),),
            "waiting were rank 0 in dist.send()"),
    Mistake("ring_calls_all_reduce", "ring", ((RING_CHUNKS, "    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "
                                                            "\"sum\" else dist.ReduceOp.MAX)\n    return tensor\n"),),
            "called dist.all_reduce()"),
    Mistake("ring_no_all_gather_copy", "ring", (("        chunks[recv_index].copy_(incoming)\n", ""),),
            "differs from dist.all_reduce"),
    Mistake("ring_max_adds", "ring", (('        if op == "sum":\n', '        if True:\n'),), "with 'max'"),
    Mistake("ring_remainder_dropped", "ring", ((RING_CHUNKS, "    size = tensor.numel() // world_size\n"
                                                             "    chunks = tensor.view(-1)[:size * world_size].split(size)\n"),),
            "1,001 floats with 'sum' on 2 processes"),
    Mistake("ring_whole_tensor_passed", "ring", ((RING_CHUNKS, RING_WHOLE),), "messages (a ring: 2 each)"),
    # the receiver adds into the chunk it sent: with uneven chunks a message outgrows the buffer and
    # gloo aborts the process (SIGABRT from C++), which is the learner's doing, not the checker's
    Mistake("ring_chunk_sizes_disagree", "ring",
            (("        send_index, recv_index = (rank - s) % world_size, (rank - s - 1) % world_size\n",
              "        send_index, recv_index = (rank - s) % world_size, (rank - s) % world_size\n"),),
            "received a message of another size than the buffer it posted"),
    Mistake("sampler_epoch_ignored", "sampler", (("manual_seed(self.seed + self.epoch)", "manual_seed(self.seed)"),),
            "had the same order"),
    Mistake("sampler_unseeded", "sampler", ((SAMPLER_SHUFFLE, "            order = torch.randperm(self.size).tolist()\n"),),
            "other indices when iterated again"),
    Mistake("sampler_seeded_by_rank", "sampler", (("manual_seed(self.seed + self.epoch)",
                                                   "manual_seed(self.seed + self.epoch + self.rank)"),),
            "no rank got index"),
    Mistake("sampler_no_padding", "sampler", (("            while len(order) < total:\n"
                                               "                order += order[:total - len(order)]\n",
                                               "            pass\n"),), "but its len() is"),
    Mistake("sampler_len_ignores_drop_last", "sampler", (("        if self.drop_last:\n"
                                                          "            return self.size // self.num_replicas\n", ""),),
            "drop_last=True, epoch 0: rank 1's sampler gave 6 indices, but its len() is 7"),
    Mistake("predict_broadcast_from_rank_0", "predict", (('"broadcast": [[3, 30], [3, 30], [3, 30], [3, 30]]',
                                                         '"broadcast": [[1, 10], [1, 10], [1, 10], [1, 10]]'),),
            "broadcast: after dist.broadcast(buffer, src=2), rank 0 holds [3, 30]"),
    Mistake("predict_all_gather_own_buffer", "predict", (('"all_gather": [[1, 10, 2, 20, 3, 30, 4, 40]] * 4',
                                                          '"all_gather": [[1, 10], [2, 20], [3, 30], [4, 40]]'),),
            "5 of 6 predictions right; all_gather"),
    Mistake("predict_reduce_scatter_not_summed", "predict", (('"reduce_scatter": [[10, 20], [30, 40], [50, 60], [70, 80]]',
                                                              '"reduce_scatter": [[1, 2], [3, 4], [5, 6], [7, 8]]'),),
            "reduce_scatter: after dist.reduce_scatter"),
    Mistake("predict_one_list_not_per_rank", "predict", (('"all_reduce": [[10, 100], [10, 100], [10, 100], [10, 100]]',
                                                          '"all_reduce": [10, 100]'),), "not one list per rank"),
    # launching for real: the torchrun form of the lab, and checkpoints under torchrun
    Mistake("torchrun_rank_from_local_rank", "torchrun", (('    rank = int(os.environ["RANK"])\n',
                                                          '    rank = local_rank\n'),),
            "rank 1's samplers were given num_replicas=2, rank=0"),
    Mistake("torchrun_world_size_per_node", "torchrun", (('    args.world_size = int(os.environ["WORLD_SIZE"])\n',
                                                         '    args.world_size = int(os.environ["LOCAL_WORLD_SIZE"])\n'),),
            "num_replicas=1"),
    Mistake("checkpoint_every_rank_saves", "checkpoint", ((SAVE_GUARD, "    if True:\n        checkpoint = {\n"),),
            "ranks 0 and 1 each wrote checkpoint.pt"),
    Mistake("checkpoint_no_barrier", "checkpoint", ((SAVE_BARRIER, ""),), "rank 1 went on without waiting"),
    # after saving, every rank reloads the file to share the state, without waiting for rank 0
    Mistake("checkpoint_loaded_while_written", "checkpoint",
            ((SAVE_BARRIER, "    load_checkpoint(path, model, optimizer, next(model.parameters()).device)\n" + SAVE_BARRIER),),
            "read checkpoint.pt while rank 0 was still writing"),
    Mistake("checkpoint_not_atomic", "resume", ((SAVE_ATOMIC, "        torch.save(checkpoint, path)\n"),),
            "could not load the checkpoint it left"),
    Mistake("resume_at_saved_epoch", "resume", (('    return checkpoint["epoch"] + 1\n', '    return checkpoint["epoch"]\n'),),
            "began again at epoch 1"),
    Mistake("resume_without_optimizer", "resume", (('    optimizer.load_state_dict(checkpoint["optimizer"])\n', ""),),
            "differ from an undisturbed run's"),
    # elastic_predictions.py
    Mistake("elastic_join_counted_as_failure", "elastic",
            (('        "restarts": [0, 0],  # a node that joins is no failure\n', '        "restarts": [0, 1],\n'),),
            "node_joins(6, 1) predicted restarts = [0, 1]; the course's runs measured [0, 0]: a node that joins is no failure"),
    Mistake("elastic_join_without_a_new_life", "elastic", (('        "world_sizes": [1, 2],', '        "world_sizes": [2],'),),
            "node_joins(6, 1) predicted world_sizes = [2]; the course's runs measured [1, 2]"),
    Mistake("elastic_lost_resumes_at_saved_epoch", "elastic",
            (('        "resumes_at": after_epoch + 1,  # epoch after_epoch was saved before B died\n',
              '        "resumes_at": after_epoch,\n'),),
            "node_lost(6, 2) predicted resumes_at = 2; the course's runs measured 3"),
    Mistake("elastic_lost_node_waited_for", "elastic", (('        "world_sizes": [2, 1],', '        "world_sizes": [2, 2],'),),
            "node_lost(6, 2) predicted world_sizes = [2, 2]; the course's runs measured [2, 1]: the rendezvous lets B's seat go"),
    # scaling_model.py
    Mistake("speedup_inverted", "scaling", (("    return {n: times[1] / t for n, t in times.items()}\n",
                                             "    return {n: t / times[1] for n, t in times.items()}\n"),),
            "speedup({1: 66, 2: 34"),
    Mistake("efficiency_not_divided", "scaling", (("    return {n: s / n for n, s in speedup(times).items()}\n",
                                                   "    return dict(speedup(times))\n"),), "efficiency({1: 66"),
    Mistake("epoch_time_with_first_epoch", "scaling", (("    later = times[1:] or times\n", "    later = times\n"),),
            "the mean without the first epoch is 5.1"),
    Mistake("fit_comm_as_ring_volume", "scaling", (("[[1 / n, 1.0, n - 1.0] for n in ns]", "[[1 / n, 1.0, (n - 1.0) / n] for n in ns]"),),
            "the least-squares fit is"),
    Mistake("predict_comm_times_n", "scaling", (("    return t_par / n + t_seq + t_comm * (n - 1)\n",
                                                 "    return t_par / n + t_seq + t_comm * n\n"),), "predict_time(("),
    Mistake("half_efficiency_speedup_below_half", "scaling", (("        if one / (n * predict_time(params, n)) < 0.5:\n",
                                                               "        if one / predict_time(params, n) < 0.5:\n"),),
            "gave 174 (the model's efficiency at N = 174 is 0.0029); the model's efficiency first drops below one half at N = 9"),
    Mistake("half_efficiency_last_above_half", "scaling", (("            return n\n", "            return n - 1\n"),),
            "gave 8 (the model's efficiency at N = 8 is 0.5410); the model's efficiency first drops below one half at N = 9"),
    Mistake("half_efficiency_max_n_ignored", "scaling", (("    for n in range(1, max_n + 1):\n", "    for n in range(1, 1025):\n"),),
            "gave 669; the model's efficiency stays at one half or more for every N up to 500"),
    # large_batch_training.py: the plan (trained for real: 2 processes, 4 epochs, target 0.8)
    Mistake("large_batch_rate_not_scaled", "large_batch", (("    scaled = 0.02 * world_size * LARGE_BATCH / 16\n",
                                                            "    scaled = 0.02\n"),),
            "below 0.8 within 4 epochs"),
    Mistake("large_batch_warmup_never_ends", "large_batch", (("    warmup_steps = warmup_epochs * steps_per_epoch\n",
                                                              "    warmup_steps = steps_per_epoch * steps_per_epoch\n"),),
            "still rising at the last step"),
    Mistake("large_batch_batch_not_larger", "large_batch", (("LARGE_BATCH = 32  #", "LARGE_BATCH = 16  #"),),
            "the task is a batch of at least 32 per process"),
    # large_batch_training.py: the rate the optimizer used
    Mistake("lr_scaling_world_size_one", "lr_scaling", (("large_batch_lr(step, len(train_loader), args.world_size)",
                                                         "large_batch_lr(step, len(train_loader), 1)"),),
            "optimizer step 1 used the rate 0.02125, while large_batch_lr(1, 16, 2) says 0.02375"),
    Mistake("lr_scaling_once_an_epoch", "lr_scaling", (
        ("    for images, labels in loader:\n        for group in optimizer.param_groups:  # this step's learning rate\n"
         "            group[\"lr\"] = lr_at(step)\n",
         "    for group in optimizer.param_groups:  # this epoch's learning rate\n        group[\"lr\"] = lr_at(step)\n"
         "    for images, labels in loader:\n"),),
            "optimizer step 1 used the rate 0.02, while large_batch_lr(1, 16, 2) says"),
    Mistake("lr_scaling_set_after_the_step", "lr_scaling", (
        ("        for group in optimizer.param_groups:  # this step's learning rate\n"
         "            group[\"lr\"] = lr_at(step)\n", ""),
        ("        optimizer.step()\n        num_images += len(labels)\n",
         "        optimizer.step()\n        for group in optimizer.param_groups:\n"
         "            group[\"lr\"] = lr_at(step)\n        num_images += len(labels)\n")),
            # every rate a step late: its large-batch run ends near the target, on either side of it from one
            # recording to the next (0.789, then 0.871; the solution's 0.883), so only its own item is held to it
            "optimizer step 0 used the rate 0.01, while large_batch_lr(0, 16, 2) says 0.02"),
    # ddp_by_hand.py
    Mistake("naive_not_divided", "naive_ddp", (("                parameter.grad /= world_size\n", ""),),
            "from one process trained on the whole batch"),
    Mistake("naive_no_broadcast", "naive_ddp", (("        dist.broadcast(tensor.data, src=0)\n", "        pass\n"),),
            "kept its own initial weights"),
    Mistake("naive_buffers_not_broadcast", "naive_ddp", (  # the parameters alone: the model's buffer stays each rank's
        ("    for tensor in list(module.parameters()) + list(module.buffers()):\n",
         "    for tensor in module.parameters():\n"),), "buffer shift still held this rank's own initial values"),
    Mistake("naive_frozen_gradient_reduced", "naive_ddp", (
        ("            if parameter.grad is not None:\n                dist.all_reduce(parameter.grad)\n"
         "                parameter.grad /= world_size\n",
         "            dist.all_reduce(parameter.grad)\n            parameter.grad /= world_size\n"),), "NaiveDDP(model): "),
    Mistake("overlap_never_waits", "overlap_ddp", ((OVERLAP_WAIT, "            gradient /= world_size\n"),),
            "waited for 0 of them"),
    Mistake("overlap_not_divided", "overlap_ddp", ((OVERLAP_WAIT, "            handle.wait()\n"),),
            "from DistributedDataParallel"),
    # naive_ddp left as handed out, and overlap_ddp's own mistake: its verdict and hint are its own
    # ("divide by the world size"), with naive_ddp named only as a possible cause
    Mistake("overlap_not_divided_naive_unfinished", "overlap_ddp", (
        ("                dist.all_reduce(parameter.grad)\n                parameter.grad /= world_size\n", "                pass\n"),
        (OVERLAP_WAIT, "            handle.wait()\n")), "OverlapDDP(model) left weights",
            also_fails=(("naive_ddp", "NaiveDDP(model) left weights"),)),
    Mistake("overlap_hook_on_frozen", "overlap_ddp", (
        ("            if parameter.requires_grad:\n                parameter.register_post_accumulate_grad_hook(self._launch)\n",
         "            parameter.register_post_accumulate_grad_hook(self._launch)\n"),), "OverlapDDP(model): "),
    Mistake("overlap_blocking_in_the_hook", "overlap_ddp", (
        ("        handle = dist.all_reduce(parameter.grad, async_op=True)  # returns at once; the sum arrives later\n"
         "        self.pending.append((handle, parameter.grad))\n",
         "        dist.all_reduce(parameter.grad)\n        self.pending.append((None, parameter.grad))\n"),
        (OVERLAP_WAIT, "            gradient /= world_size\n")), "they waited there, one by one"),
    Mistake("overlap_only_rank_0_sends", "overlap_ddp", (  # the others never answer: the checker stops the hang
        ("        handle = dist.all_reduce(parameter.grad, async_op=True)  # returns at once; the sum arrives later\n"
         "        self.pending.append((handle, parameter.grad))\n",
         "        if dist.get_rank() == 0:\n            handle = dist.all_reduce(parameter.grad, async_op=True)\n"
         "            self.pending.append((handle, parameter.grad))\n"),), "deadlocked (nothing happened for"),
    Mistake("bucketed_forward_order", "bucketed_ddp", (
        ("        for parameter in reversed([p for p in module.parameters() if p.requires_grad]):\n",
         "        for parameter in [p for p in module.parameters() if p.requires_grad]:\n"),), "all-reduced tensors of"),
    Mistake("bucketed_leftover_never_sent", "bucketed_ddp", (
        ("        for k in range(len(self.buckets)):\n            if k not in self.pending:\n                self._launch(k)\n",
         ""),), "holding 5 parameters (unused.bias, unused.weight, hidden.bias, hidden.weight, embed.weight) was never all-reduced"),
    Mistake("bucketed_size_in_elements", "bucketed_ddp", (
        ("            nbytes = parameter.numel() * parameter.element_size()\n",
         "            nbytes = parameter.numel()\n"),), "all-reduced tensors of"),
    # sharded_optimizer.py
    Mistake("zero_not_sharded", "zero", ((ZERO_MINE, "        mine = self.params\n"),), "held 100% of plain AdamW's"),
    Mistake("zero_no_broadcast", "zero", ((ZERO_SEND, ""),), "kept the initial value"),
    Mistake("zero_broadcast_from_rank_0", "zero", ((ZERO_SEND, ZERO_SEND.replace("src=self.owner[i]", "src=0")),),
            "never changed on any rank"),
    Mistake("zero_only_the_owner_broadcasts", "zero", (  # a broadcast is a collective: every rank calls it
        (ZERO_SEND, "        for i, p in enumerate(self.params):\n            if self.owner[i] == dist.get_rank():\n"
                    "                dist.broadcast(p.data, src=self.owner[i])\n"),), "deadlocked (nothing happened for"),
    Mistake("zero_options_dropped", "zero", (("optimizer_cls(mine, **kwargs)", "optimizer_cls(mine)"),),
            "from plain AdamW's after 3 steps"),
    Mistake("zero_drops_the_last_shard_rest", "zero", (  # shards cut by count, the remainder forgotten
        ("        self.owner = {}\n        owned = [0] * world_size\n"
         "        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):\n"
         "            least = owned.index(min(owned))\n            self.owner[i] = least\n"
         "            owned[least] += self.params[i].numel()\n",
         "        per_rank = len(self.params) // world_size\n"
         "        self.owner = {i: i // per_rank for i in range(per_rank * world_size)}\n"),
        (ZERO_MINE, ZERO_MINE.replace("self.owner[i] == rank", "self.owner.get(i) == rank")),
        (ZERO_SEND, "        for i, p in enumerate(self.params):\n            if i in self.owner:\n"
                    "                dist.broadcast(p.data, src=self.owner[i])\n")), "never changed on any rank"),
    Mistake("zero_shards_by_count", "zero", (  # round robin: balanced by number of tensors, not elements
        ("        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):\n"
         "            least = owned.index(min(owned))\n            self.owner[i] = least\n"
         "            owned[least] += self.params[i].numel()\n",
         "        for i in range(len(self.params)):\n            self.owner[i] = i % world_size\n"),),
            "rank 1 held 94% of plain AdamW's optimizer state"),
    # zero1_bytes (notebook 21): the bytes each rank holds under ZeRO-1, predicted
    Mistake("zero_memory_gradients_sharded", "zero_memory", ((ZERO_MEMORY_RETURN, ZERO_MEMORY_RETURN.replace(
        '"gradients": whole, "optimizer_state": s} for s in state]',
        '"gradients": 4 * o, "optimizer_state": s} for o, s in zip(owned, state)]')),),
            "divided among the ranks, as ZeRO-2 does"),
    Mistake("zero_memory_no_step_count", "zero_memory", ((
        "        state[least] += 4 * (2 * n + 1)", "        state[least] += 4 * 2 * n"),),
            "AdamW keeps more per parameter than its two running averages"),
    Mistake("zero_memory_even_shares", "zero_memory", ((ZERO_MEMORY_RETURN, ZERO_MEMORY_RETURN.replace(
        '"optimizer_state": s} for s in state]', '"optimizer_state": sum(state) // world_size} for s in state]')),),
            "the same for every rank, but your ShardedOptimizer's shards are not even"),
    Mistake("zero_memory_state_whole_on_every_rank", "zero_memory", ((ZERO_MEMORY_RETURN, ZERO_MEMORY_RETURN.replace(
        '"optimizer_state": s} for s in state]', '"optimizer_state": sum(state)} for s in state]')),),
            "every rank whole, as in DDP"),
]
# hang_training.py (notebook 23): a fix that moves the hang, one that gives other numbers, one that trains otherwise
HANG_VOTE = ("        bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])\n"
             "        dist.all_reduce(bad, op=dist.ReduceOp.MAX)\n        if bad.item() > 0:\n")
HANG_SUMS = ("    dist.all_reduce(sums)  # once, after the loop: every rank has made the same calls, however many batches\n"
             "    model.train()\n    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()\n")
HANG_FIRST_VALIDATION = ("    loss, accuracy = evaluate(model, x_val, y_val, args.val_batch_size, rank, world_size)\n"
                         "    if rank == 0:\n")
HANG_LOSS = "        loss = F.cross_entropy(model(x), y)\n"
EXERCISE_MISTAKES += [
    Mistake("hang_validation_on_rank_0_only", "hang_finishes", (  # only rank 0 needs the numbers: the hang moves
        (HANG_FIRST_VALIDATION, "    if rank == 0:\n" + HANG_FIRST_VALIDATION.splitlines(keepends=True)[0].replace("    ", "        ", 1)),),
            "waiting were rank 0 in dist.all_reduce()"),
    Mistake("hang_checkpoint_own_state_only", "hang_finishes", (  # no collective left, and no other rank's state
        ("    states = [None] * dist.get_world_size()\n    dist.all_gather_object(states, rank_state)\n",
         "    states = [rank_state]\n"),), "with the state of 1, 1 ranks, not of all 2"),
    Mistake("hang_validation_mean_of_means", "hang_validation", (  # the shards are uneven: 19 and 18 samples
        (HANG_SUMS, "    means = sums[:2] / sums[2]\n    dist.all_reduce(means)\n    means /= dist.get_world_size()\n"
                    "    model.train()\n    return means[0].item(), means[1].item()\n"),), "but one process gives"),
    Mistake("hang_validation_own_shard_only", "hang_validation", (  # no collective left: rank 0 prints its shard's
        ("    dist.all_reduce(sums)  # once, after the loop: every rank has made the same calls, however many batches\n",
         ""),), "but one process gives"),
    Mistake("hang_validation_shards_taken_as_even", "hang_validation", (  # rank 0's count times 2: 38, not 37
        ("    dist.all_reduce(sums)  # once, after the loop: every rank has made the same calls, however many batches\n",
         "    count = sums[2] * world_size  # every shard as large as this one\n    dist.all_reduce(sums)\n"),
        ("    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()\n",
         "    return (sums[0] / count).item(), (sums[1] / count).item()\n")), "but one process gives"),
    Mistake("hang_finishes_validation_left_in_the_loop", "hang_finishes", (  # the checkpoint fixed, not the validation
        ("        sums += torch.stack([", "        batch = torch.stack(["),
         ("    dist.all_reduce(sums)  # once, after the loop: every rank has made the same calls, however many batches\n",
          ""),
         ("(logits.argmax(dim=1) == y).sum().float(), torch.tensor(float(len(y)))])\n",
          "(logits.argmax(dim=1) == y).sum().float(), torch.tensor(float(len(y)))])\n"
          "        dist.all_reduce(batch)\n        sums += batch\n")), "in dist.all_reduce()"),
    Mistake("hang_skip_decided_per_rank", "hang_same_steps", (  # no hang, but the ranks pair different batches
        (HANG_VOTE, "        if not torch.isfinite(loss):\n"),), "the ranks made 22 optimizer steps each, but one process makes 20"),
    Mistake("hang_skip_min_vote", "hang_same_steps", (  # skips only when every rank's loss is bad: trains on NaN
        (HANG_VOTE, HANG_VOTE.replace("ReduceOp.MAX", "ReduceOp.MIN")),), "the ranks made 4 optimizer steps each"),
    Mistake("hang_corrupt_samples_left_out", "hang_same_steps", (  # each rank trains on its finite samples: other means
        (HANG_LOSS, "        finite = torch.isfinite(x).all(dim=1)\n"
                    "        loss = F.cross_entropy(model(x[finite]), y[finite])\n"),), "no batch was skipped"),
]
# input_pipeline.py (notebook 18): a pipeline that fixes one cause of the slowness or none, or trains on other
# batches: fewer, in another order, or other images
PIPELINE_READ = """\
    (size,) = struct.unpack("<I", disk.read(0, 4))
    data = disk.read(0, struct.unpack_from("<I", disk.read(4 * (size + 1), 4 * (size + 2)))[0])
    starts = struct.unpack_from(f"<{size + 1}I", data, 4)
    images, labels = zip(*(decode(data[starts[i]:starts[i + 1]]) for i in range(size)))
    memory = torch.utils.data.TensorDataset(torch.stack(images), torch.tensor(labels))
    return DataLoader(memory, batch_size=batch_size, sampler=sampler)
"""
PIPELINE_LOADER = "    return DataLoader(memory, batch_size=batch_size, sampler=sampler)\n"
PIPELINE_HEADER_ONCE = """\
    class Located(Images):  # the header read once: each image's record is one request
        def __init__(self, disk):
            super().__init__(disk)
            self.starts = struct.unpack_from(f"<{self.size + 1}I", disk.read(4, 4 * (self.size + 2)))

        def __getitem__(self, index):
            return decode(self.disk.read(self.starts[index], self.starts[index + 1]))

    return DataLoader(Located(disk), batch_size=batch_size, sampler=sampler, num_workers=4, persistent_workers=True)
"""
EXERCISE_MISTAKES += [
    Mistake("input_pipeline_more_workers", "input_pipeline", (  # the usual recipe: the share still queues every read
        (PIPELINE_READ, "    return DataLoader(Images(disk), batch_size=batch_size, sampler=sampler, num_workers=4, "
                        "persistent_workers=True)\n"),),
            "no faster than the handed-out one"),
    Mistake("input_pipeline_header_once", "input_pipeline", (  # one cause fixed, one request per image left
        (PIPELINE_READ, PIPELINE_HEADER_ONCE),),
            "but not enough: a batch still waits for something your change left as it was"),
    Mistake("input_pipeline_drops_last", "input_pipeline", (  # the short last batch of each epoch dropped
        (PIPELINE_LOADER, PIPELINE_LOADER.replace("sampler=sampler", "sampler=sampler, drop_last=True")),),
            "the last batch of each epoch (16 images, the rest of the rank's 256) never reached the model"),
    Mistake("input_pipeline_one_pass", "input_pipeline", (  # an iterator: gone through in the first epoch, empty after
        (PIPELINE_LOADER, PIPELINE_LOADER.replace("return DataLoader(", "return iter(DataLoader(").replace(")\n", "))\n")),),
            "could be gone through once only"),
    Mistake("input_pipeline_own_sampler", "input_pipeline", (  # a sampler of its own: another order, never set_epoch
        (PIPELINE_LOADER, PIPELINE_LOADER.replace("sampler=sampler", "sampler=DistributedSampler(memory, seed=1)")),),
            "in another order than the handed-out one"),
    Mistake("input_pipeline_normalised", "input_pipeline", (  # normalised on the way: other images
        (PIPELINE_LOADER, "    memory.tensors = ((memory.tensors[0] - 0.5) / 0.29, memory.tensors[1])\n"
                          + PIPELINE_LOADER),),
            "the same images in the same order, but the model ended with other weights"),
]
# slurm_env.py (notebook 16): SLURM's variables mapped to PyTorch's
SLURM_RANK = '"RANK": environ["SLURM_PROCID"]'
SLURM_ADDR = '"MASTER_ADDR": hosts[0]'
SLURM_PORT = '"MASTER_PORT": str(PORT_BASE + int(environ["SLURM_JOB_ID"]) % PORT_SPAN)'
EXERCISE_MISTAKES += [
    Mistake("slurm_env_rank_is_localid", "slurm_env", ((SLURM_RANK, SLURM_RANK.replace("PROCID", "LOCALID")),),
            "each of 0 to 7 must be given to one task"),
    Mistake("slurm_env_master_is_own_node", "slurm_env", ((SLURM_ADDR, '"MASTER_ADDR": environ["SLURMD_NODENAME"]'),),
            "every task must be told the same one"),
    Mistake("slurm_env_hostlist_taken_literally", "slurm_env", (
        (SLURM_ADDR, '"MASTER_ADDR": environ["SLURM_JOB_NODELIST"]'),),
            "the node list as SLURM writes it is not a host name"),
    Mistake("slurm_env_fixed_port", "slurm_env", ((SLURM_PORT, '"MASTER_PORT": "29500"'),), "both got the port 29500"),
    Mistake("slurm_env_port_is_job_id", "slurm_env", ((SLURM_PORT, '"MASTER_PORT": environ["SLURM_JOB_ID"]'),),
            "the port was '987654', not a whole number from 1024 to 65535"),
    Mistake("slurm_env_reads_os_environ", "slurm_env", ((SLURM_RANK, SLURM_RANK.replace("environ", "os.environ")),),
            "raised KeyError"),
]
# slurm_job.sbatch (notebook 16): the batch script that starts the job's tasks
SLURM_SRUN = "srun --kill-on-bad-exit=1 bash -c '\n"
SLURM_TASK = """\
srun --kill-on-bad-exit=1 bash -c '
    export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID
    export WORLD_SIZE=$SLURM_NTASKS LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE
    exec python "$TRAIN_SCRIPT" "$@"
' bash "$@"
"""
EXERCISE_MISTAKES += [
    Mistake("slurm_job_double_quotes", "slurm_job", (  # the batch script expands the variables: its own task 0's
        (SLURM_TASK, SLURM_TASK.replace("bash -c '", 'bash -c "').replace("' bash", '" bash')
         .replace('"$TRAIN_SCRIPT" "$@"', '\\"\\$TRAIN_SCRIPT\\" \\"\\$@\\"')),),
            "was told RANK=0 and LOCAL_RANK=0, though SLURM gave them SLURM_PROCID 0, 1, 2, 3"),
    # the same in double quotes as a learner first writes them, nothing escaped: the batch shell expands all
    Mistake("slurm_job_double_quotes_unescaped", "slurm_job", (
        (SLURM_TASK, SLURM_TASK.replace("bash -c '", 'bash -c "').replace("' bash", '" bash')),),
            "expanded once, by the batch script's own shell"),
    Mistake("slurm_job_no_kill_on_bad_exit", "slurm_job", ((SLURM_SRUN, SLURM_SRUN.replace("--kill-on-bad-exit=1 ", "")),),
            "the other tasks went on waiting for it"),
    Mistake("slurm_job_local_rank_is_procid", "slurm_job", (("LOCAL_RANK=$SLURM_LOCALID", "LOCAL_RANK=$SLURM_PROCID"),),
            "got the local ranks 2, 3"),
    Mistake("slurm_job_nodelist_as_address", "slurm_job", (
        ('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', "MASTER_ADDR=$SLURM_JOB_NODELIST"),),
            "the node list as SLURM writes it is not a host name"),
    Mistake("slurm_job_one_node", "slurm_job", (("#SBATCH --nodes=2\n", "#SBATCH --nodes=1\n"),),
            "ran 2 tasks on 1 node, not 4 tasks on 2 nodes"),
]
# tensor_parallel.py (notebook 22): Megatron's f and g, the column and row layers, and 2-D parallelism
TP_F_BACKWARD = ("        grad = grad.clone()\n        dist.all_reduce(grad, group=ctx.group)\n        return grad, None\n")
TP_G_BACKWARD = "        return grad, None  # the sum's gradient with respect to each term is the gradient itself\n"
TP_ROW_FORWARD = ("        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group)\n"
                  "        return y if self.bias is None else y + self.bias  # once, after the sum\n")
TP_AVERAGE = "            dist.all_reduce(p.grad, group=group)\n            p.grad /= size\n"
EXERCISE_MISTAKES += [
    Mistake("tensor_parallel_f_and_g_swapped", "tensor_parallel", (  # each class holds the other's body
        ("class CopyToParallel(", "class Swapped("), ("class ReduceFromParallel(", "class CopyToParallel("),
        ("class Swapped(", "class ReduceFromParallel(")), "f's and g's directions are swapped"),
    Mistake("tensor_parallel_all_reduce_both_ways", "tensor_parallel", (  # g's backward sums what is already whole
        (TP_G_BACKWARD, "        grad = grad.clone()\n        dist.all_reduce(grad)\n        return grad, None\n"),),
            "it all-reduces in both directions"),
    Mistake("tensor_parallel_f_backward_identity", "tensor_parallel", (  # x's gradient left as this rank's part
        (TP_F_BACKWARD, "        return grad, None\n"),), "it needs 0 and 1"),
    Mistake("tensor_parallel_row_bias_every_rank", "tensor_parallel", (
        (TP_ROW_FORWARD, "        return ReduceFromParallel.apply(F.linear(x, self.weight, self.bias), self.group)\n"),),
            "every rank added the bias to its partial sum before the all-reduce"),
    Mistake("tensor_parallel_column_whole_weight", "tensor_parallel", (
        ("linear.weight.detach().chunk(size, dim=0)[rank].clone()", "linear.weight.detach().clone()"),
        ("linear.bias.detach().chunk(size)[rank].clone()", "linear.bias.detach().clone()")),
            "ColumnParallelLinear held 192 of fc1.weight's 192 numbers; a share is 96 (1/2)"),
    Mistake("two_d_new_group_only_mine", "two_d", (  # new_group is collective: the others never join
        ('        group = dist.new_group(ranks)\n        if rank in ranks:\n            mine["tensor"] = group\n',
         '        if rank in ranks:\n            mine["tensor"] = dist.new_group(ranks)\n'),
        ('        group = dist.new_group(ranks)\n        if rank in ranks:\n            mine["data"] = group\n',
         '        if rank in ranks:\n            mine["data"] = dist.new_group(ranks)\n')),
            "the ranks did not all make the same groups in the same order"),
    Mistake("two_d_averaged_over_world", "two_d", (
        (TP_AVERAGE, "            dist.all_reduce(p.grad)\n            p.grad /= dist.get_world_size()\n"),),
            "average_gradients all-reduced over 4 processes; the ranks that hold the same shards are 2"),
    Mistake("two_d_summed_not_divided", "two_d", ((TP_AVERAGE, "            dist.all_reduce(p.grad, group=group)\n"),),
            "from one process trained on the whole batches"),
    Mistake("two_d_layers_cut_by_world", "two_d", (  # 1/4 shares in a group of 2: the tensor group's rank ignored
        ("dist.get_world_size(group), dist.get_rank(group)\n        self.weight = nn.Parameter(linear.weight.detach()"
         ".chunk(size, dim=0)", "dist.get_world_size(), dist.get_rank()\n        self.weight = nn.Parameter("
         "linear.weight.detach().chunk(size, dim=0)"),
        ("dist.get_world_size(group), dist.get_rank(group)\n        self.weight = nn.Parameter(linear.weight.detach()"
         ".chunk(size, dim=1)", "dist.get_world_size(), dist.get_rank()\n        self.weight = nn.Parameter("
         "linear.weight.detach().chunk(size, dim=1)")), "held 48 of fc1.weight's 192 numbers; a share is 96 (1/2)"),
]
# pipeline_parallel.py (notebook 22): GPipe's and 1F1B's schedules
PP_LOSS = "        y = loss_fn(y, targets[i]) / len(micro_batches)  # the whole batch's loss is the mean over micro-batches\n"
PP_WARMUP = "    warmup = min(dist.get_world_size() - dist.get_rank() - 1, m)  # the stages after this one\n"
EXERCISE_MISTAKES += [
    Mistake("gpipe_loss_not_divided", "gpipe", ((PP_LOSS, "        y = loss_fn(y, targets[i])\n"),),
            "with 2 stages and 4 micro-batches, stage 0: the gradients are"),
    Mistake("gpipe_gradient_from_previous_stage", "gpipe", (
        ("        dist.recv(grad, src=rank + 1)\n", "        dist.recv(grad, src=rank - 1)\n"),),
            "waited in a backward pass to receive from rank -1"),
    Mistake("gpipe_input_not_requiring_grad", "gpipe", (
        ("        x.requires_grad_()  # its gradient is what this stage sends back\n", ""),), "its received input never having been made to require grad"),
    Mistake("1f1b_all_forwards_first", "1f1b", ((PP_WARMUP, "    warmup = m\n"),), "that is GPipe's order"),
    Mistake("1f1b_blocking_send", "1f1b", (  # gloo's send returns when the other side receives
        ("        sends.append((dist.isend(out, dst=rank + 1), out))\n", "        dist.send(out, dst=rank + 1)\n"),
        ("        sends.append((dist.isend(x.grad, dst=rank - 1), x.grad))\n", "        dist.send(x.grad, dst=rank - 1)\n")),
            "each waited in dist.send at once"),
    Mistake("1f1b_warmup_one_too_many", "1f1b", ((PP_WARMUP, PP_WARMUP.replace(" - 1, m)", ", m)")),),
            "started F2 while holding 2 micro-batches' activations"),
    Mistake("1f1b_backward_too_early", "1f1b", (  # a warm-up one short: stage 0 waits for B0 with F1 free to run
        (PP_WARMUP, "    warmup = max(min(dist.get_world_size() - dist.get_rank() - 2, m), 0)\n"),),
            "the stage waits, idle, where it could have run a forward pass"),
]
# interleaved_1f1b and bubble_fraction (pipeline_parallel.py, notebook 22)
PP_WHICH = "        return (v - 1 - chunk if backward else chunk), group * world + j % world\n"
PP_IWARMUP = "    warmup = min((world - rank - 1) * 2 + (v - 1) * world, total)\n"
PP_BUBBLE = "    return (stages - 1) / (chunks * micro_batches + stages - 1)\n"
EXERCISE_MISTAKES += [
    Mistake("interleaved_backward_chunks_in_forward_order", "interleaved", (
        (PP_WHICH, "        return chunk, group * world + j % world\n"),), "whose backward pass it never started"),
    Mistake("interleaved_plain_warmup", "interleaved", ((PP_IWARMUP, "    warmup = min(world - rank - 1, total)\n"),),
            "KeyError: (1, 0)"),
    Mistake("interleaved_all_forwards_first", "interleaved", ((PP_IWARMUP, "    warmup = total\n"),),
            "held the activations of all 6 micro-batches through its 2 chunks at once: that is GPipe's memory"),
    Mistake("bubble_over_compute_time", "bubble", ((PP_BUBBLE, "    return (stages - 1) / (chunks * micro_batches)\n"),),
            "bubble_fraction(2, 1) returned 1; counted on 1F1B's passes"),
    Mistake("bubble_chunks_ignored", "bubble", ((PP_BUBBLE, "    return (stages - 1) / (micro_batches + stages - 1)\n"),),
            "bubble_fraction(2, 4, 2) returned 0.2; counted on interleaved 1F1B's passes"),
    Mistake("bubble_chunks_divide_the_step", "bubble", (
        (PP_BUBBLE, "    return (stages - 1) / (chunks * (micro_batches + stages - 1))\n"),),
            "bubble_fraction(2, 4, 2) returned 0.1; counted on interleaved 1F1B's passes"),
]
# lars.py (notebook 24): LARS's trust ratio
LARS_RATIO = ("                        update = update * (group[\"eta\"] * weight_norm\n"
              "                                           / (grad_norm + group[\"weight_decay\"] * weight_norm))\n")
LARS_MOMENTUM = ("                state = self.state[p]\n                if \"momentum_buffer\" not in state:\n"
                 "                    state[\"momentum_buffer\"] = group[\"lr\"] * update\n                else:\n"
                 "                    state[\"momentum_buffer\"].mul_(group[\"momentum\"]).add_(update, alpha=group[\"lr\"])\n"
                 "                p.sub_(state[\"momentum_buffer\"])\n")
EXERCISE_MISTAKES += [
    Mistake("lars_ratio_on_biases", "lars", (("                if p.dim() > 1:", "                if True:"),),
            "the trust ratio and weight decay were applied to a parameter with one dimension"),
    Mistake("lars_no_weight_decay_in_ratio", "lars", (
        (LARS_RATIO, "                        update = update * (group[\"eta\"] * weight_norm / grad_norm)\n"),),
            "the trust ratio's denominator left out weight decay"),
    Mistake("lars_no_zero_guard", "lars", (  # a weight whose gradient is 0 gets eta / weight_decay; both 0: nan
        ("                    if weight_norm > 0 and grad_norm > 0:", "                    if True:"),),
            "the trust ratio was used where a norm is 0"),
    Mistake("lars_no_momentum", "lars", ((LARS_MOMENTUM, "                p.sub_(group[\"lr\"] * update)\n"),),
            "no momentum was kept"),
]
# kfac.py (notebooks 25 and 26): K-FAC's factors, their decompositions, and their distribution
KFAC_FACTORS = "        return a.t() @ a / len(a), g.t() @ g / len(g)\n"
KFAC_AVERAGE = ("                if layer in self.A:\n"
                "                    self.A[layer].mul_(self.factor_decay).add_(A, alpha=1 - self.factor_decay)\n"
                "                    self.G[layer].mul_(self.factor_decay).add_(G, alpha=1 - self.factor_decay)\n"
                "                else:\n                    self.A[layer], self.G[layer] = A, G\n")
KFAC_DIVIDE = "        v /= values_g[:, None] * values_a[None, :] + self.damping\n"
KFAC_WRITE = ("        layer.weight.grad.copy_(grad[:, :layer.in_features])\n        if layer.bias is not None:\n"
              "            layer.bias.grad.copy_(grad[:, -1])\n")
EXERCISE_MISTAKES += [
    Mistake("kfac_damping_on_a_only", "kfac", (
        (KFAC_DIVIDE, "        v /= values_g[:, None] * (values_a[None, :] + self.damping)\n"),),
            "the damping was added to A only"),
    Mistake("kfac_a_and_g_swapped", "kfac", ((KFAC_FACTORS, "        return g.t() @ g / len(g), a.t() @ a / len(a)\n"),),
            "G multiplies it on the left"),
    Mistake("kfac_no_bias_column", "kfac", (  # the bias forgotten: A of the inputs alone, the bias's gradient as it was
        ("        if layer.bias is not None:  # the bias is a weight on an input that is always 1\n"
         "            a = torch.cat([a, a.new_ones(len(a), 1)], dim=1)\n", ""),
        ("        if layer.bias is not None:\n            grad = torch.cat([grad, layer.bias.grad[:, None]], dim=1)\n", ""),
        (KFAC_WRITE, "        layer.weight.grad.copy_(grad)\n")),
            "the bias was left out"),
    Mistake("kfac_no_running_average", "kfac", ((KFAC_AVERAGE, "                self.A[layer], self.G[layer] = A, G\n"),),
            "without the running average"),
    Mistake("kfac_refreshed_every_step", "kfac", (
        ("        if self.steps % self.update_freq == 0:", "        if True:"),), "refreshed at every step"),
    Mistake("kfac_gradients_not_written_back", "kfac", ((KFAC_WRITE, ""),), "step() left the gradients as they were"),
    Mistake("kfac_distributed_factors_summed", "kfac_distributed", (
        ("                        factor /= world_size\n", ""),), "summed over the ranks, not averaged"),
    Mistake("kfac_distributed_factors_not_averaged", "kfac_distributed", (  # each rank's own factors
        ("                if world_size > 1:  # each rank saw", "                if False:  # each rank saw"),),
            "from its own share of the batch"),
    Mistake("kfac_distributed_every_rank_decomposes", "kfac_distributed", (
        ("                if rank == owner:\n", "                if True:\n"),), "each rank did every layer's work"),
    Mistake("kfac_distributed_shared_every_step", "kfac_distributed", (  # the same decompositions, sent again each step
        ("            self.decompose(world_size)\n        for layer", "        self.decompose(world_size)\n        for layer"),),
            "(update_freq 10: no refresh) made"),
    Mistake("kfac_distributed_broadcast_not_contiguous", "kfac_distributed", (
        ("vectors.to(factor.dtype).contiguous()", "vectors.to(factor.dtype)"),), "not contiguous"),
]
# kfac_traffic.py (notebook 26): the floats distributed K-FAC communicates a step, predicted
KFAC_TRAFFIC_A = "        for n in (inputs + bias, outputs):"
KFAC_TRAFFIC_BROADCAST = "            per_refresh += n + n * n        # its eigenvalues and eigenvectors, broadcast\n"
EXERCISE_MISTAKES += [
    Mistake("kfac_traffic_bias_forgotten", "kfac_traffic", ((KFAC_TRAFFIC_A, "        for n in (inputs, outputs):"),),
            "A sized by the inputs alone, the bias left out"),
    Mistake("kfac_traffic_refreshes_floored", "kfac_traffic", ((
        "    refreshes = -(-steps // update_freq)", "    refreshes = steps // update_freq"),),
            "counting steps // update_freq refreshes"),
    Mistake("kfac_traffic_one_process_talks", "kfac_traffic", ((
        "    if world_size == 1:  # no process group to talk to\n        return 0.0\n", ""),),
            "one process has no process group"),
    Mistake("kfac_traffic_eigenvalues_forgotten", "kfac_traffic", ((
        KFAC_TRAFFIC_BROADCAST, "            per_refresh += n * n            # its eigenvectors, broadcast\n"),),
            "eigenvectors broadcast without their eigenvalues"),
]
# capstone_lm.py (notebook 40): data-parallel training to a target loss, under the rules
CAPSTONE_EVAL = "                quality = evaluate(model, val, 256, device)"
EXERCISE_MISTAKES += [
    Mistake("capstone_target_on_training_split", "time_to_target", ((
        CAPSTONE_EVAL, "                quality = evaluate(model, train[: len(val)], 256, device)"),),
            "used 128 training samples"),
    Mistake("capstone_eval_on_a_subset", "time_to_target", ((
        "    mine = val[dist.get_rank()::dist.get_world_size()]",
        "    mine = val[: len(val) // 2][dist.get_rank()::dist.get_world_size()]"),), "covered 128 of the 256"),
    Mistake("capstone_rank_skips_evaluation", "time_to_target", ((  # rank 0 evaluates its share alone, tells the rest
        CAPSTONE_EVAL, "                found = [evaluate(model.module, val[0::2], 256, device) if rank == 0 else None]\n"
                       "                dist.broadcast_object_list(found, src=0)\n"
                       "                quality = found[0]"),
        ("    mine = val[dist.get_rank()::dist.get_world_size()]\n", "    mine = val\n"),
        ("    dist.all_reduce(sums)\n", "")), "rank 1 took part in 0 evaluations"),
    Mistake("capstone_shards_overlap", "time_to_target", (  # each process shuffles the whole set its own way
        ("    order = torch.Generator().manual_seed(args.seed)", "    order = torch.Generator().manual_seed(args.seed + rank)"),
        ("            batch = train[idx[rank::world_size]].to(device)",
         "            batch = train[idx[: len(idx) // world_size]].to(device)")), "used more than once"),
    Mistake("capstone_weights_drift", "time_to_target", ((  # no DDP: each process steps on its own gradients
        "    model = DDP(TinyGPT().to(device), device_ids=[device.index] if use_cuda else None)",
        "    model = TinyGPT().to(device)"),), "weights differ"),
    Mistake("capstone_log_counts_one_process", "time_to_target", ((
        "            samples += len(idx)  # the global batch: every process's samples",
        "            samples += len(batch)"),), "the processes had trained on"),
    Mistake("capstone_log_training_loss", "time_to_target", ((  # the last batch's loss where the split's belongs
        "                log(\"eval\", samples=samples, loss=quality, epoch=epoch)",
        "                log(\"eval\", samples=samples, loss=loss.item(), epoch=epoch)"),), "while its weights give"),
    Mistake("capstone_closed_division_other_model", "time_to_target", ((  # a wider model, still called closed
        "    model = DDP(TinyGPT().to(device),", "    model = DDP(TinyGPT(width=96).to(device),"),),
            "the model's parameters are not TinyGPT's"),
]

# zero2.py (notebook 30): ZeRO-2 by hand
ZERO2_RECEIVED = "            self.shards[b].grad = received / self.world_size\n"
ZERO2_SENT = "        work = dist.reduce_scatter_single(received, flat, async_op=True)\n"
EXERCISE_MISTAKES += [
    Mistake("zero2_sum_not_average", "zero2", ((ZERO2_RECEIVED, "            self.shards[b].grad = received\n"),),
            "the sum of the ranks' gradients"),
    Mistake("zero2_all_reduce_then_slice", "zero2", ((  # every rank receives the whole, then keeps its slice
        ZERO2_SENT, "        work = dist.all_reduce(flat, async_op=True)\n"
                    "        received = flat[self.rank * shard.numel():(self.rank + 1) * shard.numel()]\n"),),
            "every rank received whole gradients"),
    Mistake("zero2_full_gradients_kept", "zero2", ((
        "        for q in bucket:\n            q.grad = None  # the full gradients are not kept: only this rank's shard "
        "comes back\n", ""),),
            "the model's own .grad held"),
    Mistake("zero2_sent_in_step", "zero2", (  # every bucket sent once backward() is over, none overlapped
        ("        if self.ready[b] < len(self.buckets[b]):\n            return\n",
         "        if self.ready[b] < len(self.buckets[b]):\n            return\n        self.complete.append(b)\n"
         "\n    def _send(self, b):\n"),
        ("        self.in_flight = []\n        self.optimizer", "        self.in_flight, self.complete = [], []\n"
         "        self.optimizer"),
        ("        for work, b, received in self.in_flight:\n",
         "        for b in self.complete:\n            self._send(b)\n        self.complete = []\n"
         "        for work, b, received in self.in_flight:\n")),
            "began in step(), after backward() had returned"),
    Mistake("zero2_no_broadcast", "zero2", ((
        "        for tensor in [*model.parameters(), *model.buffers()]:\n            dist.broadcast(tensor.data, src=0)\n",
        ""),), "from DistributedDataParallel's"),
]

# lamb.py (notebook 31): LAMB, a trust ratio on Adam's update
LAMB_RATIO = "                    weight_norm, update_norm = p.norm(), update.norm()\n"
EXERCISE_MISTAKES += [
    Mistake("lamb_ratio_on_numerator", "lamb", ((LAMB_RATIO, "                    weight_norm, update_norm = p.norm(), "
                                                 "m_hat.norm()\n"),), "Adam's averaged gradient (its numerator) alone"),
    Mistake("lamb_no_bias_correction", "lamb", (
        ('                m_hat = state["exp_avg"] / (1 - beta1 ** t)\n', '                m_hat = state["exp_avg"]\n'),
        ('                v_hat = state["exp_avg_sq"] / (1 - beta2 ** t)\n', '                v_hat = state["exp_avg_sq"]\n')),
            "without bias correction"),
    Mistake("lamb_ratio_on_every_parameter", "lamb", (("                if p.dim() > 1:  # a layer's weights",
                                                       "                if True:  # a layer's weights"),),
            "applied to a parameter with one dimension"),
    Mistake("lamb_adamw", "lamb", ((
        "                    if weight_norm > 0 and update_norm > 0:  # a new layer of zeros, or no step: the global rate\n"
        "                        update = update * (weight_norm / update_norm)\n", ""),), "that is AdamW"),
]

# loss_scaling.py (notebook 32): fp16 dynamic loss scaling by hand
EXERCISE_MISTAKES += [
    Mistake("loss_scaling_never_grows", "loss_scaling", ((
        "            self.good_steps += 1\n            if self.good_steps == self.growth_interval:\n"
        "                self.current *= self.growth_factor\n                self.good_steps = 0\n",
        "            self.good_steps += 1\n"),), "it should have grown to"),
    Mistake("loss_scaling_skip_with_a_zero_rate", "loss_scaling", ((  # "skipped" by a step at lr 0: momentum still moves
        "        if not self.overflowed:\n            optimizer.step()\n",
        "        if self.overflowed:\n            rates = [g[\"lr\"] for g in optimizer.param_groups]\n"
        "            for g in optimizer.param_groups:\n                g[\"lr\"] = 0.0\n"
        "            optimizer.zero_grad(set_to_none=False)\n            optimizer.step()\n"
        "            for g, lr in zip(optimizer.param_groups, rates):\n                g[\"lr\"] = lr\n"
        "        else:\n            optimizer.step()\n"),), "a skipped step still changed the optimizer's state"),
    Mistake("loss_scaling_nan_not_caught", "loss_scaling", ((
        "                    if not torch.isfinite(p.grad).all():\n", "                    if torch.isinf(p.grad).any():\n"),),
            "your step moved the weights, where its gradients were not all finite"),
    Mistake("loss_scaling_count_kept_after_overflow", "loss_scaling", ((
        "            self.current *= self.backoff_factor\n            self.good_steps = 0\n",
        "            self.current *= self.backoff_factor\n"),), "since the last one skipped"),
    Mistake("loss_scaling_not_unscaled", "loss_scaling", ((
        "                    p.grad.div_(self.current)\n", ""),), "from those beside GradScaler"),
]

# checkpointing.py (notebook 33): activation checkpointing
EXERCISE_MISTAKES += [
    Mistake("checkpointing_last_run_kept", "checkpointing", ((  # torch's checkpoint_sequential's way: the last run plain
        "        x = checkpoint(blocks[start:end], x, use_reentrant=False)\n",
        "        if end < len(blocks):\n            x = checkpoint(blocks[start:end], x, use_reentrant=False)\n"
        "        else:\n            x = blocks[start:end](x)\n"),), "KB for backward during the forward"),
    Mistake("checkpointing_by_hand_input_gradient_only", "checkpointing", ((
        "        torch.autograd.backward(y, grad_output)\n        return x.grad, None\n",
        "        (grad_x,) = torch.autograd.grad(y, x, grad_output)\n        return grad_x, None\n"),),
            "a block's parameters got no gradient"),
    Mistake("checkpointing_by_hand_every_block", "checkpointing", ((  # a Recompute per block, not per run
        "        x = Recompute.apply(x, blocks[start:end])\n",
        "        for k in range(start, end):\n            x = Recompute.apply(x, blocks[k])\n"),),
            "where one input per run is 8 KB"),
    Mistake("checkpointing_not_checkpointed", "checkpointing", ((
        "        x = checkpoint(blocks[start:end], x, use_reentrant=False)\n", "        x = blocks[start:end](x)\n"),),
            "(the plain forward keeps 200 KB)"),
]

# zero3.py (notebook 34): ZeRO-3 by hand
EXERCISE_MISTAKES += [
    Mistake("zero3_freed_before_backward", "zero3", ((  # not gathered again: backward meets empty parameters
        "        if out.requires_grad:  # backward reaches this unit when the gradient of its output arrives\n"
        "            out.register_hook(lambda grad, unit=unit: self._gather(unit))\n", ""),),
            "they had been freed after its forward and not gathered again"),
    Mistake("zero3_not_freed_after_forward", "zero3", ((
        "    def _after_forward(self, unit, out):\n        self._free(unit)\n", "    def _after_forward(self, unit, out):\n"),),
            "had finished its forward already"),
    Mistake("zero3_kept_after_backward", "zero3", ((
        "        for p in unit[\"params\"]:\n            p.grad = None\n        self._free(unit)\n",
        "        for p in unit[\"params\"]:\n            p.grad = None\n"),), "had finished its backward already"),
    Mistake("zero3_sum_not_average", "zero3", ((
        "        unit[\"shard\"].grad = received / self.world_size\n", "        unit[\"shard\"].grad = received\n"),),
            "trained on the sum of the ranks' gradients"),
    Mistake("zero3_no_broadcast", "zero3", ((
        "        for tensor in [*model.parameters(), *model.buffers()]:\n            dist.broadcast(tensor.data, src=0)\n",
        ""),), "the ranks did not start from rank 0's weights"),
]

# bf16_training.py (notebook 35): fp32 master weights, and a bf16 all-reduce hook
EXERCISE_MISTAKES += [
    Mistake("bf16_masters_in_bf16", "bf16", (
        ("        self.master = [p.detach().float().clone().requires_grad_() for p in self.params]\n",
         "        self.master = [p.detach().clone().requires_grad_() for p in self.params]\n"),
        ("master.grad = None if p.grad is None else p.grad.float()", "master.grad = p.grad")), "master weights kept in bf16"),
    Mistake("bf16_masters_restarted_from_the_weights", "bf16", ((  # each step starts again from the rounded weights
        "        for p, master in zip(self.params, self.master):\n            master.grad = None if p.grad is None else",
        "        for p, master in zip(self.params, self.master):\n            master.data.copy_(p.data)\n"
        "            master.grad = None if p.grad is None else"),), "from fp32 masters stepped with the same bf16 gradients"),
    Mistake("bf16_hook_sums", "bf16", ((
        "    compressed = bucket.buffer().to(torch.bfloat16).div_(group.size())\n",
        "    compressed = bucket.buffer().to(torch.bfloat16)\n"),), "the sum over the processes, not their average"),
    Mistake("bf16_hook_sends_fp32", "bf16", ((
        "    compressed = bucket.buffer().to(torch.bfloat16).div_(group.size())\n",
        "    compressed = bucket.buffer().clone().div_(group.size())\n"),), "nothing was rounded to bf16 on the way"),
    Mistake("bf16_hook_returns_bf16", "bf16", ((
        "    return future.then(decompress)\n", "    return future.then(lambda fut: fut.value()[0])\n"),),
            "where the bucket is"),
]
EXERCISE_MISTAKES += [
    Mistake("zero3_prefetch_ignored", "zero3_prefetch", ((
        "        if self.prefetch and k + 1 < len(self.units):\n", "        if False:\n"),), "its gather had not begun"),
    Mistake("zero3_prefetch_the_unit_before", "zero3_prefetch", ((  # the wrong way: backward's order, in the forward
        "        if self.prefetch and k + 1 < len(self.units):\n"
        "            self.units[k + 1][\"arriving\"] = self._gather(self.units[k + 1], async_op=True)\n",
        "        if self.prefetch and k >= 1:\n"
        "            self.units[k - 1][\"arriving\"] = self._gather(self.units[k - 1], async_op=True)\n"),),
            "had finished its forward already"),
    Mistake("zero3_prefetch_gathers_the_unit_after_next", "zero3_prefetch", ((  # one unit too far ahead
        "            self.units[k + 1][\"arriving\"] = self._gather(self.units[k + 1], async_op=True)\n",
        "            self.units[k + 1][\"arriving\"] = self._gather(self.units[k + 1], async_op=True)\n"
        "            if k + 2 < len(self.units):\n                self._gather(self.units[k + 2])\n"),),
            "more than each unit twice"),
]

# kfac_conv.py (notebook 38): K-FAC's factors for convolutions
EXERCISE_MISTAKES += [
    Mistake("kfac_conv_positions_averaged_twice", "kfac_conv", ((  # rows of examples x positions, as a linear layer's
        "    return a.t() @ a / len(a), g.t() @ g / len(g) * positions\n",
        "    return a.t() @ a / len(a), g.t() @ g / len(g)\n"),), "the output positions were averaged in both factors"),
    Mistake("kfac_conv_no_spatial_average", "kfac_conv", ((  # the positions summed: a mean over examples only
        "    return a.t() @ a / len(a), g.t() @ g / len(g) * positions\n",
        "    return a.t() @ a / batch, g.t() @ g / batch\n"),), "summed in both factors (no spatial average)"),
    Mistake("kfac_conv_mean_loss_gradient", "kfac_conv", ((
        "    g = g * batch  # the loss is a mean: this is each example's own gradient\n", ""),),
            "not of each example's"),
    Mistake("kfac_conv_padding_ignored", "kfac_conv", ((
        "        a = F.unfold(inputs, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride)\n",
        "        a = F.unfold(inputs, layer.kernel_size, dilation=layer.dilation, stride=layer.stride)\n"),),
            "Conv2d(3, 4, 3, padding=1): A kron G is"),
    Mistake("kfac_conv_damping_on_each_factor", "kfac_conv", ((
        "    v /= values_g.clamp(min=0)[:, None] * values_a.clamp(min=0)[None, :] + damping\n",
        "    v /= (values_g.clamp(min=0)[:, None] + damping**0.5) * (values_a.clamp(min=0)[None, :] + damping**0.5)\n"),),
            "the damping was added to each factor"),
]

# accumulation.py (notebook 37): gradient accumulation in the learner's bucketed DDP
EXERCISE_MISTAKES += [
    Mistake("accumulation_every_micro_step", "accumulation", ((  # no no_sync(): every backward sends its buckets
        "        with contextlib.nullcontext() if last else model.no_sync():\n",
        "        with contextlib.nullcontext():\n"),), "began before the last micro-batch's forward pass"),
    Mistake("accumulation_no_sync_ignored", "accumulation", ((  # the flag is set, and nothing reads it
        "        if not self.sync:  # inside no_sync(): the gradient stays here, added to the next ones\n            return\n",
        ""),), "all-reduces began before the last micro-batch's forward pass (during micro-batch 1 of 4)"),
    Mistake("accumulation_loss_not_divided", "accumulation", ((
        "            (F.cross_entropy(model(inputs), labels) / k).backward()\n",
        "            F.cross_entropy(model(inputs), labels).backward()\n"),), "the step was k times too large"),
    Mistake("accumulation_zeroed_each_micro_step", "accumulation", ((
        "    optimizer.zero_grad(set_to_none=True)\n    k = len(micro_batches)\n    for i, (inputs, labels) in enumerate(micro_batches):\n",
        "    k = len(micro_batches)\n    for i, (inputs, labels) in enumerate(micro_batches):\n        optimizer.zero_grad(set_to_none=True)\n"),),
            "only the last micro-batch's gradient was left"),
    Mistake("accumulation_processes_summed", "accumulation", ((
        "            flat /= world_size\n", ""),), "summed over the processes, not averaged"),
]

# memory_budget.py (notebook 36): bytes per rank, predicted
EXERCISE_MISTAKES += [
    Mistake("memory_budget_elements_not_bytes", "memory_budget", ((
        "    size = 4  # bytes of a float32\n", "    size = 1\n"),), "these look like numbers of float32 elements, not bytes"),
    Mistake("memory_budget_one_adam_average", "memory_budget", ((
        "        \"optimizer_state\": size * 2 * (shard if stage >= 1 else elements),\n",
        "        \"optimizer_state\": size * (shard if stage >= 1 else elements),\n"),), "one running average was counted"),
    Mistake("memory_budget_gradients_sharded_at_stage_1", "memory_budget", ((
        "        \"gradients\": size * (shard if stage >= 2 else elements),\n",
        "        \"gradients\": size * (shard if stage >= 1 else elements),\n"),),
            "a shard was counted, where stage 1 does not shard the gradients"),
    Mistake("memory_budget_parameters_sharded_at_stage_2", "memory_budget", ((
        "    parameters = shard if stage >= 3 else elements\n",
        "    parameters = shard if stage >= 2 else elements\n"),),
            "a shard was counted, where stage 2 does not shard the parameters"),
    Mistake("memory_budget_every_output_kept", "memory_budget", ((  # each layer's output counted, the input not
        "    kept = sum(layer.in_features for layer in model if isinstance(layer, nn.Linear))\n",
        "    kept = sum(layer.out_features for layer in model if isinstance(layer, nn.Linear)) * 2\n"),),
            "the activations, predicted"),
    Mistake("memory_budget_shards_not_divided", "memory_budget", ((
        "    shard = math.ceil(elements / world_size)  # a flat vector split evenly, the last rank's share padded\n",
        "    shard = elements\n"),), "the whole was counted, where Adam's state is sharded at stage 1"),
]
EXERCISE_MISTAKES += [
    Mistake("memory_budget_peak_without_the_gathered_unit", "memory_budget", ((  # stage 3's peak taken as its rest
        "        \"peak_parameters\": size * (parameters + max(units) if stage >= 3 else elements),\n",
        "        \"peak_parameters\": size * parameters,\n"),), "the parameters held at the peak, predicted"),
]
