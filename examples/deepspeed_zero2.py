"""DeepSpeed ZeRO-2 with glaunch: engine checkpoints through the atomic scheme, graceful stop.

Same tiny MLP regression as examples/torch_ddp.py. The config is GLAUNCH_DS_CONFIG (the
launcher's ds_config.json, batch sizes fitted to the allocation) or DEFAULT_CONFIG below.
Micro-batch ``m`` of step ``s`` on rank ``r`` is derived from (seed, s, r, m), so resume
needs no data-loader state. With CUDA each rank trains on ``cuda:LOCAL_RANK`` over NCCL in
the precision of the config (ds_config.json's bf16/fp16 sections, from the experiment's
``precision``); without, DS_ACCELERATOR=cpu and gloo in fp32 (the runtime turns those sections off).

Optimizer: the launcher's ds_config.json has no "optimizer" section, so the script adds
one (:func:`optimizer_block`): DeepSpeed "AdamW". On CPU with ``torch_adam: true``
(plain torch.optim.AdamW): DeepSpeed's FusedAdam is a CUDA kernel, and with
offload_optimizer DeepSpeed would pick DeepSpeedCPUAdam, a C++ op JIT-built on first use
(works here, but takes about two minutes once per machine). With CUDA the block leaves
DeepSpeed its fast defaults (FusedAdam, or DeepSpeedCPUAdam under offload) where they are
prebuilt or can be built (nvcc, a C++ compiler); ``--optimizer torch`` forces torch's AdamW.

    python examples/deepspeed_zero2.py --steps 20
    torchrun --standalone --nproc-per-node 2 examples/deepspeed_zero2.py --steps 20
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import warnings
from pathlib import Path

try:
    from launcher import runtime as rt
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from launcher import runtime as rt
from launcher.runtime import deepspeed as gds
from launcher.runtime.device import observed

SEED = 1234
DIM, HIDDEN = 16, 32

DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": 32,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
    "steps_per_print": 10**9,
    "wall_clock_breakdown": False,
}


def optimizer_block(config: dict, lr: float = 1e-2, choice: str = "auto") -> dict:
    """DeepSpeed's AdamW where it is available (see gds.fast_adam_available), else torch's."""
    params: dict = {"lr": lr}
    if choice == "torch" or (choice == "auto" and not gds.fast_adam_available(config)):
        params["torch_adam"] = True
    return {"type": "AdamW", "params": params}


def make_model(hidden: int = HIDDEN, layers: int = 0):
    """DIM -> hidden -> 1, with `layers` more hidden x hidden layers between (a larger model
    for memory measurements; the default is the tiny MLP)."""
    from torch import nn

    inner = [m for _ in range(layers) for m in (nn.Linear(hidden, hidden), nn.Tanh())]
    return nn.Sequential(nn.Linear(DIM, hidden), nn.Tanh(), *inner, nn.Linear(hidden, 1))


def precision(engine) -> str:
    return "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"


def batch(step: int, rank: int, micro: int, size: int):
    import torch

    key = hashlib.sha256(f"{SEED}/{step}/{rank}/{micro}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
    w_true = torch.randn(DIM, 1, generator=torch.Generator().manual_seed(SEED))
    x = torch.randn(size, DIM, generator=g)
    y = torch.sin(x @ w_true) + 0.05 * torch.randn(size, 1, generator=g)
    return x, y


def main(argv: list[str] | None = None, default_config: dict = DEFAULT_CONFIG) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seconds-per-step", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--optimizer", choices=("auto", "torch", "deepspeed"), default="auto",
                   help="AdamW implementation: DeepSpeed's where it can be built (auto), torch's, or DeepSpeed's")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="width of the hidden layers")
    p.add_argument("--layers", type=int, default=0, help="hidden x hidden layers besides the first and last")
    rt.apply_hparams(p)                      # the experiment's hparams (hparams.lr -> --lr)
    args = p.parse_args(argv)

    # DeepSpeed's gloo path calls collectives torch 2.13 marks deprecated, once per step
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated",
                            category=FutureWarning)
    deepspeed = gds.import_deepspeed()        # DS_ACCELERATOR=cpu when there is no CUDA
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    ctx = gds.init_distributed()              # NCCL on cuda:LOCAL_RANK, gloo on CPU
    rt.install_stop_handler()
    config = gds.ds_config(default_config, ctx)
    config.setdefault("optimizer", optimizer_block(config, args.lr, args.optimizer))
    zero3 = config.get("zero_optimization", {}).get("stage", 0) == 3

    torch.manual_seed(SEED)
    if zero3:   # parameters are partitioned as they are created
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = make_model(args.hidden, args.layers)
    else:
        model = make_model(args.hidden, args.layers)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    dtype = next(engine.module.parameters()).dtype

    start, resumed_from = 0, None
    ck = rt.resume_checkpoint(ctx)
    if ck is not None:
        client = gds.load_engine(engine, ck, ctx=ctx)
        start = resumed_from = int(client.get("step", ck.step))
        if ctx.is_main:
            print(f"resumed from {ck.path} (step {start})", flush=True)

    loss_fn = nn.MSELoss()
    loss = out = torch.tensor(float("nan"))
    for step in range(start + 1, args.steps + 1):
        for m in range(accum):
            x, y = batch(step, ctx.rank, m, micro)
            out = engine(x.to(engine.device, dtype))
            loss = loss_fn(out.float(), y.to(engine.device))
            engine.backward(loss)
            engine.step()                    # the optimizer steps at the accumulation boundary
        if ctx.is_main and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        if args.seconds_per_step:
            time.sleep(args.seconds_per_step)

        saved = gds.save_engine(engine, step, ctx=ctx) if ctx.checkpoint_due(step) else None
        if rt.should_stop(step=step, total=args.steps) and step < args.steps:
            saved = saved or gds.save_engine(engine, step, ctx=ctx)
            rt.write_stop(step, saved, ctx=ctx)
            if ctx.is_main:
                print(f"glaunch: stopping at step {step}, checkpoint saved", flush=True)
                print(f"glaunch: stop requested by {rt.stop_signal()}", flush=True)
            gds.shutdown(engine)
            return 0

    final = loss.detach().float().reshape(1).to(engine.device)    # NCCL reduces CUDA tensors only
    if ctx.world_size > 1:
        dist.all_reduce(final)
        final /= ctx.world_size
    steps_done = max(start, args.steps)
    res = rt.write_result(steps_done, model=engine,        # gathers ZeRO-3 partitions: all ranks
                          final_loss=None if start >= args.steps else final.item(),
                          resumed_from=resumed_from, ctx=ctx,
                          extra={"placement": dict(observed(engine.module, out), precision=precision(engine),
                                                   optimizer=type(engine.basic_optimizer).__name__)})
    if ctx.is_main:
        print(f"done: step {steps_done} param_sha256 {res['param_sha256']}", flush=True)
    gds.shutdown(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
