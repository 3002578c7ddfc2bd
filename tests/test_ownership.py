"""The kit never deletes what it did not write: output directories are claimed (a manifest of the kit's entries,
a lock against a second process), --overwrite moves only the run's own entries aside before the first step, and an
export is written only where nothing else lives and pushed only with the files it wrote."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_kit.cli import main
from grpo_kit.course.arc import Arc
from grpo_kit.train import rundir
from grpo_kit.train.config import load_run_config


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _tiny_arc_config(out: Path):
    cfg = load_run_config("cpu-tiny-quick")
    return dataclasses.replace(cfg, output_dir=str(out), task=dataclasses.replace(cfg.task, num_test=8),
                               sft=dataclasses.replace(cfg.sft, steps=4), grpo=dataclasses.replace(cfg.grpo, steps=2))


def test_demo_refuses_a_directory_holding_an_sft_run_and_keeps_it(tmp_path, capsys):
    """The reported loss: `grpo-kit sft --output-dir X/sft`, then `grpo-kit demo --output-dir X` deleted X/sft."""
    out = tmp_path / "X"
    assert main(["sft", "--preset", "cpu-tiny-quick", "--config", str(_yaml(tmp_path, "sft: {steps: 2}")),
                 "--output-dir", str(out / "sft"), "--device", "cpu", "--quiet"]) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert main(["demo", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{out} is not empty and was not written by grpo-kit (sft): choose another output directory, or pass " \
           "--overwrite" in err, err
    # --overwrite writes beside other files, but never into (or over) one of the arc's names that is not the arc's
    assert main(["demo", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--device", "cpu", "--quiet",
                 "--overwrite"]) == 2
    assert f"{out / 'sft'} exists and was not written by this grpo-kit arc run" in capsys.readouterr().err
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(".grpo_kit")} == \
           {k: v for k, v in before.items() if not k.startswith(".grpo_kit")}


def test_overwriting_an_arc_removes_its_own_files_and_nothing_else(tmp_path):
    out = tmp_path / "arc"
    cfg = _tiny_arc_config(out)
    Arc(cfg, "cpu", progress=False).run()
    (out / "my-notes.txt").write_text("mine")
    (out / "sft" / "my-plot.png").write_bytes(b"also mine, inside a folder the arc wrote")  # goes with its folder
    first = json.loads((out / "progress.json").read_text())
    arc = Arc(cfg, "cpu", progress=False, resume=False)
    assert arc.records["phases"] == {} and "sft_eval" in first["phases"]
    assert (out / "my-notes.txt").read_text() == "mine"
    assert not (out / "sft").exists() and not (out / "summary.json").exists()


def test_a_foreign_directory_is_refused_by_sft_and_train_and_overwrite_writes_beside_it(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.jsonl").write_text("{}\n")
    common = ["--preset", "cpu-tiny-quick", "--config", str(_yaml(tmp_path, "sft: {steps: 2}\ngrpo: {steps: 1}")),
              "--output-dir", str(out), "--device", "cpu", "--quiet"]
    for command in ("sft", "train"):
        assert main([command, *common]) == 2
        assert f"{out} is not empty and was not written by grpo-kit (data.jsonl)" in capsys.readouterr().err
    assert main(["sft", *common, "--overwrite"]) == 0
    assert (out / "data.jsonl").read_text() == "{}\n" and (out / "checkpoint" / "state.json").exists()
    capsys.readouterr()
    assert main(["train", *common]) == 2  # an SFT run's directory is not GRPO's
    assert f"{out} holds a grpo-kit sft run, not a grpo one" in capsys.readouterr().err
    assert main(["sft", *common, "--overwrite"]) == 0  # over its own run: the user's file still stays
    assert (out / "data.jsonl").read_text() == "{}\n"


def test_overwrite_moves_the_previous_run_aside_before_the_first_step(tmp_path, monkeypatch, capsys):
    """A crash right after `--overwrite` starts (here: in the first step) must not leave the previous run's
    checkpoint where the next automatic resume would mix it into the new run."""
    from grpo_kit.train.grpo import GRPOTrainer

    out = tmp_path / "run"
    common = ["train", "--preset", "cpu-tiny-quick", "--config", str(_yaml(tmp_path, "grpo: {steps: 2}")),
              "--output-dir", str(out), "--device", "cpu", "--quiet"]
    assert main(common) == 0 and (out / "checkpoint").exists()

    def crash(self):
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(GRPOTrainer, "train_step", crash)
    assert main([*common, "--overwrite"]) == 2
    assert "the machine went away" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [".grpo_kit", "metrics.jsonl"]
    assert (out / "metrics.jsonl").read_text() == ""


_HOLDER = """
import sys
from grpo_kit.train.rundir import claim
run = claim(sys.argv[1], "grpo")
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_process_is_refused_naming_the_pid_and_a_crashed_holder_frees_the_directory(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["train", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--device", "cpu", "--quiet"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{out} is in use by another grpo-kit process (PID {holder.pid})" in err, err
    finally:
        holder.kill()  # SIGKILL: no clean-up runs; the OS releases the lock
        holder.wait()
    run = rundir.claim(out, "grpo")
    assert (out / ".grpo_kit" / "lock").read_text().strip() == str(__import__("os").getpid())
    run.release()


def test_the_same_process_may_claim_again_and_the_lock_goes_with_the_last_owner(tmp_path):
    first = rundir.claim(tmp_path / "run", "sft")
    second = rundir.claim(tmp_path / "run", "sft")  # a notebook cell run twice
    key = str((tmp_path / "run").resolve())
    assert rundir._HELD[key][1] == 2
    del first
    import gc

    gc.collect()
    assert rundir._HELD[key][1] == 1
    second.release()
    assert key not in rundir._HELD


def test_a_directory_without_a_manifest_is_not_taken_for_the_kits_even_when_its_names_are(tmp_path):
    """Names alone do not make a directory the kit's: without .grpo_kit/run.json it is refused, and overwriting
    writes beside its files, never over them."""
    out = tmp_path / "old"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "state.json").write_text("{}")
    (out / "metrics.jsonl").write_text("someone's rows")
    with pytest.raises(rundir.RunDirError, match="is not empty and was not written by grpo-kit"):
        rundir.claim(out, "grpo")
    run = rundir.claim(out, "grpo", overwrite=True)
    assert run.entries == [] and (out / "metrics.jsonl").read_text() == "someone's rows"
    with pytest.raises(rundir.RunDirError):
        run.add("metrics.jsonl")
    run.release()


# -- export and push ---------------------------------------------------------------------------------------------------
@pytest.fixture()
def exported(tmp_path, tiny):
    from grpo_kit.eval.export import export_model

    model, tokenizer = tiny
    return export_model(model, tokenizer, tmp_path / "export", base_name="tiny-gemma")


def test_export_refuses_a_foreign_directory_and_replaces_only_its_own_files(tmp_path, tiny, exported):
    from grpo_kit.eval.export import export_model

    model, tokenizer = tiny
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model-00002-of-00002.safetensors").write_bytes(b"someone else's shard")
    with pytest.raises(rundir.RunDirError, match="is not empty and was not written by grpo-kit"):
        export_model(model, tokenizer, foreign, base_name="tiny-gemma")
    assert sorted(p.name for p in foreign.iterdir()) == ["model-00002-of-00002.safetensors"] or \
        sorted(p.name for p in foreign.iterdir()) == [".grpo_kit", "model-00002-of-00002.safetensors"]
    stale = exported / "model-00001-of-00009.safetensors"  # pretend an earlier, bigger export left this shard
    manifest = json.loads((exported / ".grpo_kit" / "run.json").read_text())
    stale.write_bytes(b"stale")
    manifest["entries"].append(stale.name)
    (exported / ".grpo_kit" / "run.json").write_text(json.dumps(manifest))
    export_model(model, tokenizer, exported, base_name="tiny-gemma")
    assert not stale.exists() and (exported / "model.safetensors").exists()


class StandInHub:
    """Records what `push_folder` asks of huggingface_hub.HfApi; `existing` is None (no repo) or its privacy."""

    calls: list = []
    existing: bool | None = None

    def __init__(self, token=None):
        self.token = token

    def repo_info(self, repo_id):
        from huggingface_hub.errors import RepositoryNotFoundError

        type(self).calls.append(("repo_info", repo_id))
        if type(self).existing is None:
            error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # as raised, without a live response
            Exception.__init__(error, "404 Client Error: Repository Not Found")
            raise error
        return type("Info", (), {"private": type(self).existing})()

    def create_repo(self, repo_id, private=None, exist_ok=False):
        type(self).calls.append(("create_repo", repo_id, private))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, repo_id, folder_path, allow_patterns=None, commit_message=None):
        from huggingface_hub.utils import filter_repo_objects

        every = [p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file()]
        sent = sorted(filter_repo_objects(every, allow_patterns=allow_patterns))  # what upload_folder would send
        type(self).calls.append(("upload_folder", repo_id, sent))


@pytest.fixture()
def hub(monkeypatch):
    import huggingface_hub

    StandInHub.calls, StandInHub.existing = [], None
    monkeypatch.setattr(huggingface_hub, "HfApi", StandInHub)
    monkeypatch.setenv("HF_TOKEN", "hf_test_write_token")
    return StandInHub


def test_a_push_sends_only_the_exported_files_to_a_new_private_repo(exported, hub):
    from grpo_kit.eval.export import push_folder

    (exported / "stray-notes.txt").write_text("not part of the export")
    (exported / "checkpoint").mkdir()
    (exported / "checkpoint" / "optimizer.pt").write_bytes(b"not part of the export either")
    push_folder(exported, "me/tiny")
    (_, _, private), (_, _, sent) = [c for c in hub.calls if c[0] != "repo_info"]
    assert private is True
    expected = sorted(p.name for p in exported.iterdir() if p.is_file() and p.name != "stray-notes.txt")
    assert sent == expected and "config.json" in sent and "README.md" in sent


def test_an_existing_public_repo_is_reported_before_any_upload(exported, hub):
    from grpo_kit.engine.hub import ModelAccessError
    from grpo_kit.eval.export import push_folder

    hub.existing = False  # public
    with pytest.raises(ModelAccessError, match="me/tiny exists and is public, so this upload would be public"):
        push_folder(exported, "me/tiny")
    assert [c[0] for c in hub.calls] == ["repo_info"]
    push_folder(exported, "me/tiny", allow_public=True)
    assert [c[0] for c in hub.calls] == ["repo_info", "repo_info", "upload_folder"]


def test_a_folder_the_kit_did_not_export_is_not_pushed(tmp_path, hub):
    from grpo_kit.eval.export import push_folder

    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "id_rsa").write_text("secret")
    with pytest.raises(rundir.RunDirError, match="was not written by grpo-kit export"):
        push_folder(tmp_path / "home", "me/oops")
    assert hub.calls == []


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text + "\ntask: {num_test: 8}\n")
    return path


def test_two_claims_in_one_process_share_one_manifest(tmp_path):
    """A command claims the directory, then its trainer does: what either records stays recorded."""
    command, trainer = rundir.claim(tmp_path / "run", "grpo"), rundir.claim(tmp_path / "run", "grpo")
    trainer.add("metrics.jsonl")
    command.add("checkpoint")
    assert json.loads((tmp_path / "run" / ".grpo_kit" / "run.json").read_text())["entries"] == ["metrics.jsonl",
                                                                                                "checkpoint"]
    command.release()
    trainer.release()


@pytest.fixture()
def kaggle(monkeypatch):
    """A stand-in for Kaggle Models: kagglehub.model_upload records the files it would send (kagglehub's own filter
    over the ignore patterns it is given); `visibility` is what the model's page says (missing, private, public)."""
    import kagglehub
    from kagglehub.gcs_upload import filtered_walk, normalize_patterns
    from kagglehub.models import DEFAULT_IGNORE_PATTERNS

    import grpo_kit.eval.export as export

    record = {"calls": [], "visibility": "missing"}

    def model_upload(handle, local_model_dir, license_name=None, version_notes="", ignore_patterns=None):
        patterns = normalize_patterns(default=DEFAULT_IGNORE_PATTERNS, additional=ignore_patterns)
        sent = sorted(
            str(Path(root, f).relative_to(local_model_dir))
            for root, _, files in filtered_walk(base_dir=local_model_dir, ignore_patterns=patterns)
            for f in files
        )
        record["calls"].append(("model_upload", handle, sent, version_notes))

    monkeypatch.setattr(kagglehub, "model_upload", model_upload)
    monkeypatch.setattr(
        export,
        "kaggle_visibility",
        lambda owner, model: record["calls"].append(("visibility", owner, model)) or record["visibility"],
    )
    monkeypatch.setenv("KAGGLE_USERNAME", "me")
    monkeypatch.setenv("KAGGLE_KEY", "kaggle_test_key")
    return record


def test_a_kaggle_push_sends_only_the_exported_files_with_the_card(exported, kaggle):
    from grpo_kit.eval.export import push

    (exported / "stray-notes.txt").write_text("not part of the export")
    (exported / "checkpoint").mkdir()
    (exported / "checkpoint" / "optimizer.pt").write_bytes(b"not part of the export either")
    url = push(exported, "kaggle:me/tiny-grpo")
    assert url == "https://www.kaggle.com/models/me/tiny-grpo"
    (_, owner, model), (_, handle, sent, _) = kaggle["calls"]
    assert (owner, model, handle) == ("me", "tiny-grpo", "me/tiny-grpo/transformers/default")
    expected = sorted(p.name for p in exported.iterdir() if p.is_file() and p.name != "stray-notes.txt")
    assert sent == expected and "README.md" in sent and "config.json" in sent  # the card goes; .grpo_kit/ does not


def test_an_existing_public_kaggle_model_is_reported_and_credentials_are_asked_for(exported, kaggle, monkeypatch):
    from grpo_kit.engine.hub import ModelAccessError
    from grpo_kit.eval.export import push

    kaggle["visibility"] = "public"
    with pytest.raises(ModelAccessError, match="kaggle:me/tiny exists and is public, so this upload would be public"):
        push(exported, "kaggle:me/tiny/transformers/v2")
    assert [c[0] for c in kaggle["calls"]] == ["visibility"]
    push(exported, "kaggle:me/tiny/transformers/v2", allow_public=True)
    assert kaggle["calls"][-1][1] == "me/tiny/transformers/v2"
    with pytest.raises(ValueError, match="expected kaggle:<owner>/<model>"):
        push(exported, "kaggle:just-a-name")
    monkeypatch.delenv("KAGGLE_USERNAME")
    monkeypatch.delenv("KAGGLE_KEY")
    monkeypatch.setattr(Path, "home", lambda: exported / "nowhere")
    with pytest.raises(ModelAccessError, match="needs your Kaggle API token: set KAGGLE_USERNAME and KAGGLE_KEY"):
        push(exported, "kaggle:me/tiny")
