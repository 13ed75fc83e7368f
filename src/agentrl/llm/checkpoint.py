"""Checkpoints through fsspec: a local folder by default, `s3://bucket/prefix` for S3/MinIO.

Layout under the storage path:
    step-00000100/   adapters or weights, tokenizer, trainer_state.pt (optimiser, schedule,
                     RNG), trainer_config.json, metrics.json, model_card.md, manifest.json
    best/            the checkpoint with the highest holdout reward so far
    final/           written when a run ends

A checkpoint is written to a local temp folder, uploaded, and `manifest.json` (sha256 of
every file) goes up last: a folder without a valid manifest is incomplete and ignored, so
a crash or a failed upload never hides or corrupts an earlier checkpoint. Rotation deletes
the oldest step folders only after the new one is complete.

Loading never runs code from a checkpoint: the manifest is checked first (every path stays
inside the folder, no file is missing, extra or changed), weights are safetensors, and the
trainer state goes through `torch.load(weights_only=True)` (tensors and plain containers
only, no pickled objects). `load_checkpoint_policy` is the safe way to load a checkpoint
folder someone else wrote (the deployer, the gateway).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
import torch

from agentrl.core.errors import TrainingError
from agentrl.llm.loading import BASE_FILE

if TYPE_CHECKING:
    from agentrl.llm.trainer import PolicyTrainer

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.pt"
STEP_PREFIX = "step-"
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_card(trainer: PolicyTrainer, metrics: dict[str, Any], run_info: dict[str, Any]) -> str:
    """A short markdown card: what this model is, how it was trained, on what, how well."""
    cfg = trainer.config
    info = trainer.policy.info
    lines = [
        f"# {run_info.get('name', 'agentrl policy checkpoint')}",
        "",
        f"- base model: {info.get('base_model', cfg.model)}",
        f"- algorithm: {cfg.algorithm}"
        + (f" (LoRA r={cfg.lora_r}, alpha={cfg.lora_alpha})" if cfg.is_lora else " (full)"),
        f"- optimiser steps: {trainer.global_step}",
        f"- data: {run_info.get('data', 'not stated')}",
        f"- written: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "",
        "## Metrics",
        "",
    ]
    lines += [
        f"- {k}: {v:.6g}" if isinstance(v, float) else f"- {k}: {v}" for k, v in metrics.items()
    ]
    lines += ["", "## Hyperparameters", "", "```json", cfg.model_dump_json(indent=2), "```", ""]
    return "\n".join(lines)


class CheckpointManager:
    """Save, rotate, verify and restore checkpoints under one fsspec storage path."""

    def __init__(
        self,
        storage_path: str,
        max_checkpoints: int = 5,
        storage_options: dict[str, Any] | None = None,
        run_info: dict[str, Any] | None = None,
    ) -> None:
        options = dict(storage_options or {})
        endpoint = options.pop("endpoint_url", None)
        if endpoint and storage_path.startswith("s3://"):
            options.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
        self.fs, root = fsspec.core.url_to_fs(storage_path, **options)
        self.root = root.rstrip("/")
        self.storage_path = storage_path.rstrip("/")
        self.max_checkpoints = max_checkpoints
        self.run_info = dict(run_info or {})
        self.best_score: float | None = self._read_best_score()

    # -- paths ------------------------------------------------------------------------------

    def _join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def url(self, name: str) -> str:
        """The user-facing address of checkpoint `name` (with the s3:// prefix if any)."""
        return f"{self.storage_path}/{name}"

    def list_steps(self) -> list[str]:
        """Complete step checkpoints, oldest first."""
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        names = sorted(
            e.rstrip("/").rsplit("/", 1)[-1]
            for e in entries
            if e.rstrip("/").rsplit("/", 1)[-1].startswith(STEP_PREFIX)
        )
        return [n for n in names if self.fs.exists(self._join(n, MANIFEST))]

    def latest(self) -> str | None:
        steps = self.list_steps()
        return steps[-1] if steps else None

    # -- save -------------------------------------------------------------------------------

    def save(
        self, trainer: PolicyTrainer, metrics: dict[str, Any] | None = None, name: str | None = None
    ) -> str:
        """Write a checkpoint (default name: step-NNNNNNNN), then rotate. Returns its URL."""
        if not trainer.dist.is_main:
            return ""
        name = name or f"{STEP_PREFIX}{trainer.global_step:08d}"
        metrics = dict(metrics or {})
        with tempfile.TemporaryDirectory(prefix="agentrl-ckpt-") as tmp:
            local = Path(tmp)
            try:
                self._write_local(trainer, metrics, local)
                self._upload(local, name)
            except TrainingError:
                raise
            except Exception as exc:
                raise TrainingError(
                    f"could not write checkpoint {self.url(name)}: {type(exc).__name__}: {exc}; "
                    "earlier checkpoints are untouched",
                    "INFRA",
                ) from exc
        if name.startswith(STEP_PREFIX):
            self.rotate()
        log.info("checkpoint written: %s", self.url(name))
        return self.url(name)

    def _write_local(self, trainer: PolicyTrainer, metrics: dict[str, Any], out: Path) -> None:
        policy = trainer.policy
        policy.model.save_pretrained(out)
        if policy.is_lora:
            base = {"name": policy.info.get("requested", trainer.config.model)}
            base.update(seed=policy.info.get("seed", 0), tiny_kwargs=policy.info.get("tiny_kwargs"))
            (out / BASE_FILE).write_text(json.dumps(base))
        policy.tokenizer.save_pretrained(out)
        torch.save(trainer.trainer_state(), out / STATE_FILE)
        (out / "trainer_config.json").write_text(trainer.config.model_dump_json(indent=2))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float))
        (out / "model_card.md").write_text(model_card(trainer, metrics, self.run_info))
        files = sorted(p for p in out.rglob("*") if p.is_file())
        manifest = {
            "step": trainer.global_step,
            "files": {str(p.relative_to(out)): sha256_file(p) for p in files},
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2))

    def put(self, local: Path, name: str) -> str:
        """Store a checkpoint folder written elsewhere (manifest last); returns its URL."""
        try:
            self._upload(local, name)
        except Exception as exc:
            raise TrainingError(
                f"could not write checkpoint {self.url(name)}: {type(exc).__name__}: {exc}",
                "INFRA",
            ) from exc
        return self.url(name)

    def _fence(self, what: str) -> None:
        """A job process whose runner lost the job's lease writes nothing (see
        `agentrl.llm.fence`)."""
        from agentrl.llm.fence import check_fence

        check_fence(self.fs, self.root, f"{what} {self.url('')}")

    def _upload(self, local: Path, name: str) -> None:
        if not name.startswith(STEP_PREFIX):
            # best/ and final/ are replaced: write beside, then swap, so a failed upload
            # leaves the previous one in place.
            self._put_tree(local, f"{name}.partial")
            self._fence(f"replacing checkpoint {name} in")
            if self.fs.exists(self._join(name)):
                self.fs.rm(self._join(name), recursive=True)
            self.fs.mv(self._join(f"{name}.partial"), self._join(name), recursive=True)
            return
        self._put_tree(local, name)

    def _put_tree(self, local: Path, name: str) -> None:
        dest = self._join(name)
        self._fence(f"writing checkpoint {name} in")
        if self.fs.exists(dest):
            self.fs.rm(dest, recursive=True)
        self.fs.makedirs(dest, exist_ok=True)
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
        for p in files:  # manifest last: it marks the checkpoint complete
            target = self._join(name, str(p.relative_to(local)))
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(p), target)
        self._fence(f"completing checkpoint {name} in")  # the manifest is the commit
        self.fs.put_file(str(local / MANIFEST), self._join(name, MANIFEST))

    def rotate(self) -> list[str]:
        """Delete the oldest step checkpoints beyond max_checkpoints; returns what went."""
        steps = self.list_steps()
        gone = steps[: max(0, len(steps) - self.max_checkpoints)]
        if gone:
            self._fence("rotating checkpoints in")
        for n in gone:
            self.fs.rm(self._join(n), recursive=True)
        return gone

    def save_best(self, trainer: PolicyTrainer, score: float, metrics: dict[str, Any]) -> bool:
        """Keep `best/` as the checkpoint with the highest `score` (holdout reward)."""
        if self.best_score is not None and score <= self.best_score:
            return False
        self.save(trainer, {**metrics, "best_score": score}, name="best")
        self.best_score = score
        return True

    def _read_best_score(self) -> float | None:
        path = self._join("best", "metrics.json")
        try:
            if self.fs.exists(path):
                with self.fs.open(path, "r") as fh:
                    value = json.load(fh).get("best_score")
                return None if value is None else float(value)
        except Exception:  # a damaged best/ must not stop a run: the next best replaces it
            log.warning("could not read %s", path)
        return None

    # -- load -------------------------------------------------------------------------------

    def verify(self, name: str) -> bool:
        """True if every file listed in the manifest is there with the right sha256."""
        with tempfile.TemporaryDirectory(prefix="agentrl-verify-") as tmp:
            try:
                local = self.download(name, Path(tmp))
            except TrainingError:
                return False
            return verify_local(local)

    def download(self, name: str, into: Path) -> Path:
        """Copy checkpoint `name` into a local folder (returns it)."""
        src = self._join(name)
        if not self.fs.exists(self._join(name, MANIFEST)):
            raise TrainingError(f"no complete checkpoint at {self.url(name)}", "DATA")
        target = into / name
        target.mkdir(parents=True, exist_ok=True)
        islink = getattr(self.fs, "islink", None)
        for remote in self.fs.find(src):
            rel = remote[len(src) :].lstrip("/")
            if islink is not None and islink(remote):  # a link could copy in any host file
                raise TrainingError(f"symlink {rel!r} in checkpoint {self.url(name)}", "DATA")
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(remote, str(dest))
        return target

    def resume(self, trainer: PolicyTrainer, name: str | None = None) -> str | None:
        """Restore weights, optimiser, schedule and counters from `name` (default: latest).
        Returns the name restored, or None when there is nothing to resume."""
        name = name or self.latest()
        if name is None:
            return None
        with tempfile.TemporaryDirectory(prefix="agentrl-resume-") as tmp:
            local = self.download(name, Path(tmp))
            try:
                check_manifest(local)
            except TrainingError as exc:
                raise TrainingError(f"checkpoint {self.url(name)}: {exc}", "DATA") from exc
            load_weights(trainer.policy, local, verified=True)
            trainer.load_trainer_state(load_trainer_state_file(local / STATE_FILE))
        return name


def check_manifest(folder: Path) -> dict[str, str]:
    """Raise `TrainingError` ("DATA") unless `manifest.json` lists exactly the folder's files,
    each inside the folder and with the right sha256. Returns the manifest's file table."""
    root = folder.resolve()
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise TrainingError(f"no {MANIFEST} in {folder}: incomplete checkpoint", "DATA")
    try:
        files = json.loads(manifest_path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainingError(f"unreadable {MANIFEST} in {folder}: {exc}", "DATA") from exc
    listed: set[Path] = set()
    for rel, digest in files.items():
        p = _inside(root, rel)
        if not p.is_file():
            raise TrainingError(f"{rel!r} is listed in the manifest but missing", "DATA")
        if sha256_file(p) != digest:
            raise TrainingError(f"{rel!r} does not match its sha256 in the manifest", "DATA")
        listed.add(p)
    for p in folder.rglob("*"):
        if p.is_symlink() or p.is_file():
            real = _inside(root, str(p.relative_to(folder)))
            if real != manifest_path.resolve() and real not in listed:
                raise TrainingError(f"{p.relative_to(folder)} is not in the manifest", "DATA")
    return {str(k): str(v) for k, v in files.items()}


def _inside(root: Path, rel: str) -> Path:
    """`root/rel` with symlinks resolved; raises if it is absolute or leaves `root`."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or "\x00" in rel:
        raise TrainingError(f"manifest path {rel!r} is not a relative path", "DATA")
    p = (root / rel).resolve()
    if not p.is_relative_to(root):
        raise TrainingError(f"manifest path {rel!r} leaves the checkpoint folder", "DATA")
    return p


def verify_local(folder: Path) -> bool:
    """True if `check_manifest` passes (the reason it failed is logged)."""
    try:
        check_manifest(folder)
    except TrainingError as exc:
        log.warning("checkpoint %s fails verification: %s", folder, exc)
        return False
    return True


def load_trainer_state_file(path: Path) -> dict[str, Any]:
    """Optimiser, schedule, counters and RNG: tensors and plain containers only."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for anything but tensors and containers
        raise TrainingError(
            f"unsafe or unreadable trainer state {path.name}: {exc}", "DATA"
        ) from exc
    if not isinstance(state, dict):
        raise TrainingError(f"trainer state {path.name} is not a dict", "DATA")
    return state


def load_checkpoint_policy(folder: Path | str, **kwargs: Any) -> Any:
    """Verify a local checkpoint folder against its manifest, then load it as a policy
    (`agentrl.llm.loading.load_policy`: safetensors only). Raises `TrainingError`."""
    from agentrl.llm.loading import load_policy

    path = Path(folder)
    check_manifest(path)
    pickles = [
        p.name for p in path.rglob("*") if p.suffix in PICKLE_SUFFIXES and p.name != STATE_FILE
    ]
    if pickles:
        raise TrainingError(f"pickle files in checkpoint {folder}: {pickles[:3]}", "DATA")
    if not any(path.glob("*.safetensors")):
        raise TrainingError(f"no safetensors weights in {folder}", "DATA")
    return load_policy(str(folder), **kwargs)


def load_weights(policy: Any, folder: Path, verified: bool = False) -> None:
    """Load saved adapters (LoRA) or full weights from `folder` into `policy.model`, after
    checking the manifest (unless the caller just did: `verified=True`)."""
    from safetensors.torch import load_file

    if not verified:
        check_manifest(folder)
    if policy.is_lora:
        from peft import set_peft_model_state_dict

        weights = load_file(str(folder / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(policy.model, weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise TrainingError(f"adapter keys do not match the model: {unexpected[:5]}", "DATA")
        return
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise TrainingError(f"no weights (*.safetensors) in {folder}", "DATA")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = policy.model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if policy.model.config.tie_word_embeddings else set()
    if [k for k in missing if k not in tied] or unexpected:
        raise TrainingError(
            f"checkpoint weights do not match the model (missing={missing[:3]}, "
            f"unexpected={unexpected[:3]})",
            "DATA",
        )
