"""Many LoRA adapters over one plain base model, applied per batch row (the local engine's
lineages: each agent's live version, canaries, and the base, decoding in one batch).

peft's mixed-adapter forward (`adapter_names=[...]`) loops over the adapters of a batch in
every LoRA layer: a gather, two matmuls, a scale and a scatter per adapter per layer, and
`load_adapter` rebuilds modules under the engine's lock. Measured on SmolLM2-135M (16 rows,
one decode step, 2 busy cores): 0.90 s base, 1.34 s with one adapter, 1.83 s with 16.

Here each target Linear keeps one stack of its adapters' weights, A [slots, r, in] and
B [slots, out, r] (ranks padded with zeros, B pre-scaled by alpha/r), and a forward hook
adds the rows' deltas with one gather and two batched matmuls whatever the number of
adapters (one plain pair of matmuls when every row has the same adapter; nothing when all
rows are the base). Slot 0 is the base (zeros).

Adapters change by swapping an immutable `Stacks` snapshot: a forward takes the snapshot
once when it starts (`rows()`), so a load builds the new stacks outside any lock while
batches decode, and a removal is deferred (`retire`, then `collect` between decode steps)
until no row uses the adapter.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.serving.errors import DeployError

BASE = "__base__"
# adapter_config.json features this path does not apply: refused with a clear error
_UNSUPPORTED = {
    "use_dora": "DoRA",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
    "lora_bias": "LoRA bias",
    "modules_to_save": "modules_to_save (fully trained layers)",
    "trainable_token_indices": "trainable tokens",
    "target_parameters": "target_parameters",
    "alpha_pattern": "alpha_pattern",
    "use_bdlora": "BD-LoRA",
}


@dataclass(frozen=True)
class Adapter:
    """One adapter's weights by base-model module name: (A [r, in], B [out, r] pre-scaled)."""

    name: str
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


@dataclass(frozen=True)
class Stacks:
    """An immutable snapshot: slot per adapter name, and per module its stacked weights."""

    slots: dict[str, int] = field(default_factory=lambda: {BASE: 0})
    # module name -> (A [slots, r, in], B [slots, out, r])
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # slot -> module names where that slot's weights are not zero
    present: dict[int, frozenset[str]] = field(default_factory=dict)


def _trim() -> None:
    """Give the heap's free pages back to the OS (glibc). Each change builds new stacks and
    frees the old ones: without it RSS grew by 17.9 MiB per SmolLM2 adapter of 7.0 MiB of
    weights (16 loaded one by one), with it by 8.6."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def read_adapter(name: str, folder: Path, modules: dict[str, torch.nn.Linear]) -> Adapter:
    """A peft LoRA checkpoint (adapter_config.json + adapter_model.safetensors or .bin) as
    plain tensors keyed by the base model's Linear names; DeployError for what it cannot
    serve (unknown modules, shapes that do not fit the base, features listed above)."""
    from peft import LoraConfig
    from peft.utils import load_peft_weights

    try:
        config = LoraConfig.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as exc:
        raise DeployError(f"{folder}: unreadable adapter_config.json: {exc}") from exc
    for attr, what in _UNSUPPORTED.items():
        if getattr(config, attr, None):
            raise DeployError(f"{folder}: adapters with {what} are not served by the local engine")
    state = load_peft_weights(str(folder), device="cpu")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        stem = key.removeprefix("base_model.model.")
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.weight"
            if stem.endswith(marker):
                pairs.setdefault(stem[: -len(marker)], {})[part] = tensor
                break
        else:
            raise DeployError(f"{folder}: weight {key} is not a LoRA A/B matrix")
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module_name, ab in pairs.items():
        linear = modules.get(module_name)
        if linear is None or "lora_A" not in ab or "lora_B" not in ab:
            raise DeployError(f"{folder}: {module_name} is no Linear of the base model")
        a, b = ab["lora_A"], ab["lora_B"]
        out_f, in_f = linear.weight.shape
        r = a.shape[0]
        if a.shape != (r, in_f) or b.shape != (out_f, r):
            raise DeployError(
                f"{folder}: {module_name} has LoRA shapes {tuple(a.shape)} x {tuple(b.shape)}, "
                f"the base's Linear is {out_f} x {in_f}"
            )
        scale = config.lora_alpha / (r**0.5 if config.use_rslora else r)
        dtype = linear.weight.dtype
        weights[module_name] = (a.to(dtype).contiguous(), (b.to(dtype) * scale).contiguous())
    if not weights:
        raise DeployError(f"{folder}: the adapter holds no LoRA weights")
    return Adapter(name, weights)


def _with(stacks: Stacks, adapter: Adapter) -> Stacks:
    """`stacks` plus `adapter` in a new last slot (ranks padded to the largest)."""
    slot = len(stacks.slots)
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module in {*stacks.layers, *adapter.weights}:
        old = stacks.layers.get(module)
        new = adapter.weights.get(module)
        like = new[0] if new is not None else old[0]  # type: ignore[index]
        in_f = like.shape[-1]
        out_f = new[1].shape[0] if new is not None else old[1].shape[1]  # type: ignore[index]
        r = max(old[0].shape[1] if old is not None else 0, new[0].shape[0] if new else 0)
        a_all = like.new_zeros((slot + 1, r, in_f))
        b_all = like.new_zeros((slot + 1, out_f, r))
        if old is not None:
            a_all[:slot, : old[0].shape[1]] = old[0]
            b_all[:slot, :, : old[1].shape[2]] = old[1]
        if new is not None:
            a_all[slot, : new[0].shape[0]] = new[0]
            b_all[slot, :, : new[1].shape[1]] = new[1]
        layers[module] = (a_all, b_all)
    present = {**stacks.present, slot: frozenset(adapter.weights)}
    return Stacks({**stacks.slots, adapter.name: slot}, layers, present)


def _without(stacks: Stacks, names: set[str]) -> Stacks:
    """`stacks` less the adapters `names` (slots renumbered, unused layers and rank cut)."""
    keep = [(n, s) for n, s in stacks.slots.items() if n not in names]
    index = torch.tensor([s for _, s in keep])
    present = {i: stacks.present.get(s, frozenset()) for i, (_, s) in enumerate(keep)}
    used = set().union(*present.values()) if present else set()
    layers = {}
    for module, (a, b) in stacks.layers.items():
        if module in used:
            layers[module] = (a.index_select(0, index).clone(), b.index_select(0, index).clone())
    return Stacks({n: i for i, (n, _) in enumerate(keep)}, layers, present)


class MultiLora:
    """Per-row LoRA over `model` (a plain transformers model; never wrapped). Thread-safe:
    loads and removals may run while another thread decodes."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.linears: dict[str, torch.nn.Linear] = {
            name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
        }
        self.stacks = Stacks()
        self._retired: set[str] = set()
        self._change = threading.Lock()  # one snapshot change at a time (not the forward)
        self._local = threading.local()  # the forward's (stacks, slot index) per thread
        # every Linear is hooked now, not when an adapter first names it: registering a hook
        # mutates the module's hook dict, which a forward in another thread iterates
        for name, linear in self.linears.items():
            linear.register_forward_hook(self._delta_hook(name))

    # ---- adapters ---------------------------------------------------------------------
    def add(self, name: str, folder: Path) -> int:
        """Read and stack the adapter in `folder` as `name` (no forward waits for it).
        Returns the bytes its weights hold."""
        adapter = read_adapter(name, folder, self.linears)
        nbytes = adapter.nbytes
        with self._change:
            if name in self.stacks.slots:
                raise DeployError(f"adapter {name} is already loaded")
            self.stacks = _with(self.stacks, adapter)
        del adapter  # its tensors were copied into the stacks: freed before the trim
        _trim()
        return nbytes

    def retire(self, name: str) -> None:
        """Mark `name` for removal once no row uses it (`collect`)."""
        with self._change:
            if name in self.stacks.slots and name != BASE:
                self._retired.add(name)

    def collect(self, in_use: set[str]) -> list[str]:
        """Drop the retired adapters no row in `in_use` names; returns their names."""
        with self._change:
            gone = {n for n in self._retired if n not in in_use}
            if gone:
                self.stacks = _without(self.stacks, gone)
                self._retired -= gone
        if gone:
            _trim()
        return sorted(gone)

    def has_retired(self) -> bool:
        return bool(self._retired)

    def names(self) -> list[str]:
        return [n for n in self.stacks.slots if n != BASE and n not in self._retired]

    def nbytes(self) -> int:
        """Bytes of the stacked weights (padding included): what the adapters cost."""
        return sum(a.nbytes + b.nbytes for a, b in self.stacks.layers.values())

    # ---- forward ----------------------------------------------------------------------
    @contextlib.contextmanager
    def rows(self, adapters: list[str]) -> Iterator[None]:
        """A forward inside applies `adapters[i]` to batch row i (BASE: none). A single name
        applies to every row, whatever the batch size. KeyError for an unknown adapter."""
        stacks = self.stacks
        slots = [stacks.slots[a] for a in adapters]
        uniq = set(slots)
        if uniq == {0}:
            state: Any = None  # the base: no hook does anything
        elif len(uniq) == 1:
            state = (stacks, slots[0], None)
        else:
            state = (stacks, None, torch.tensor(slots))
        prev = getattr(self._local, "state", None)
        self._local.state = state
        try:
            yield
        finally:
            self._local.state = prev

    def _delta_hook(self, module: str) -> Any:
        def hook(_m: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> Any:
            state = getattr(self._local, "state", None)
            if state is None:
                return None
            stacks, slot, index = state
            layer = stacks.layers.get(module)
            if layer is None:
                return None
            a, b = layer
            x = inputs[0]
            if slot is not None:  # one adapter for every row: two plain matmuls
                if module not in stacks.present.get(slot, ()):
                    return None
                return out + (x @ a[slot].t()) @ b[slot].t()
            shape = x.shape  # [B, ..., in]: rows of the batch first
            x3 = x.reshape(shape[0], -1, shape[-1])
            h = torch.bmm(x3, a.index_select(0, index).transpose(1, 2))
            delta = torch.bmm(h, b.index_select(0, index).transpose(1, 2))
            return out + delta.reshape(*shape[:-1], delta.shape[-1])

        return hook
