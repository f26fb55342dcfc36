"""A fresh optimizer's state, allocated from a DCP checkpoint's metadata for the load to fill.

DCP's state_dict API (``get_state_dict``, ``set_state_dict``) gives an optimizer that has
no state yet some by running a step with zero gradients: for AdamW a pass over every
parameter that creates two state tensors each, all of it overwritten by the load that
follows, and most of the time a resume took. The checkpoint's metadata names every state
entry of every parameter with its global shape and dtype: :func:`allocate_from_metadata`
creates those entries uninitialised (``torch.empty``; placed like the parameter where they
have its shape, so that FSDP2's DTensor shards stay sharded the way the parameter is), and
DCP then finds the state present and runs no step.
"""

from __future__ import annotations

from collections.abc import Iterable

STATE_PREFIX = "optimizer.state."


def _fqns_by_param(model) -> dict | None:
    """Each parameter's name as DCP's state_dict API writes it (no ``module.`` of DDP, no
    ``_orig_mod.`` of torch.compile), or None where that is not one name per parameter."""
    try:
        from torch.distributed.checkpoint.state_dict import _get_fqns
    except ImportError:   # a torch whose DCP names parameters its own way: DCP initialises
        return None
    names = {}
    for name, param in model.named_parameters():
        fqns = _get_fqns(model, name)
        if len(fqns) != 1:   # FSDP1's flat parameters hold several
            return None
        names[param] = next(iter(fqns))
    return names


def _saved_state(metadata, known: Iterable[str]) -> dict[str, dict] | None:
    """``{parameter name: {state name: storage metadata}}`` of the optimizer state in the
    checkpoint, or None where an entry names no known parameter (nested or foreign state)."""
    known = set(known)
    saved: dict[str, dict] = {}
    for key, md in metadata.state_dict_metadata.items():
        if not key.startswith(STATE_PREFIX):
            continue
        fqn, _, entry = key[len(STATE_PREFIX):].rpartition(".")
        if fqn not in known:
            return None
        saved.setdefault(fqn, {})[entry] = md
    return saved


def _placeholder(param, md):
    """An uninitialised value the load overwrites, of the saved entry's shape and dtype; None
    for a non-tensor entry; ``NotImplemented`` where its placement cannot be told (a state
    tensor of a DTensor parameter that has neither the parameter's shape nor none)."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.tensor import DTensor

    if not isinstance(md, TensorStorageMetadata):
        return None
    dtype = md.properties.dtype
    if md.size == param.shape:
        return torch.empty_like(param, dtype=dtype, requires_grad=False)
    if len(md.size) == 0:   # a step count: where the optimizer wants it is its load_state_dict's call
        return torch.empty((), dtype=dtype)
    if isinstance(param, DTensor):
        return NotImplemented
    return torch.empty(md.size, dtype=dtype, device=param.device)


def allocate_from_metadata(model, optimizers: list, metadata) -> list:
    """Give each of ``optimizers`` that has no state yet the entries the checkpoint holds for its
    parameters, uninitialised; returns those given state (whose state the caller clears
    when the load fails). Allocates nothing and returns [] where the checkpoint's entries do
    not match the parameters by name: DCP's own initialisation runs then."""
    fresh = [o for o in optimizers if not o.state]
    names = _fqns_by_param(model) if fresh else None
    saved = _saved_state(metadata, names.values()) if names else None
    if not saved:
        return []
    planned: list[tuple] = []
    for optimizer in fresh:
        for group in optimizer.param_groups:
            for param in group["params"]:
                fqn = names.get(param) if names else None
                if fqn is None:   # a parameter the model does not name
                    return []
                entries = {k: _placeholder(param, md) for k, md in saved.get(fqn, {}).items()}
                if any(v is NotImplemented for v in entries.values()):
                    return []
                if entries:
                    planned.append((optimizer, param, entries))
    for optimizer, param, entries in planned:
        optimizer.state[param] = entries
    return fresh if planned else []
